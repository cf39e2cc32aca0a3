"""Harness for the TypeScript SDK's tests (sdks/typescript/test, node's own test runner).

Node tests run against the real services, started here as in the other suites: api,
dispatcher, sweeper and projector on loopback ports over the test's own PostgreSQL database
and MongoDB database. A small control service lets a Node test restart the dispatcher (on
the same port) while its worker runs. The package is installed (`npm ci`, skipped while
package-lock.json is what was last installed) and compiled (`tsc`) once per session.

Node 20 or newer is required; scripts/test.sh installs it. Without it these tests fail with
a message saying so rather than being skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from evora.config import Settings
from evora_services.api.app import create_app as create_api
from evora_services.dispatcher.app import create_app as create_dispatcher
from evora_services.projector.app import create_app as create_projector
from evora_services.sweeper.app import create_app as create_sweeper
from evora_services.sweeper.sweeper import Tuning
from tests.servers import Service, serve

PACKAGE = Path(__file__).resolve().parents[2] / "sdks" / "typescript"
MIN_NODE_MAJOR = 20

ADMIN_TOKEN = "ts-admin-token-000"
PRODUCER_TOKEN = "ts-producer-token-0"
WORKER_TOKEN = "ts-worker-token-000"
TOKENS = f"admin:{ADMIN_TOKEN},producer:{PRODUCER_TOKEN},worker:{WORKER_TOKEN}"

# How long one `node --test` run may take before it is stopped and its output shown.
NODE_RUN_TIMEOUT_S = 240


@dataclass(frozen=True)
class NodeTools:
    node: str
    test_dir: Path  # the compiled tests


def _node_major(node: str) -> int | None:
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    match = re.fullmatch(r"v(\d+)\.\d+\.\d+\s*", out.stdout)
    return int(match.group(1)) if match else None


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, cwd=PACKAGE, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"{what} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}", False)


@pytest.fixture(scope="session")
def node_tools() -> NodeTools:
    """Node 20+, the package's devDependencies installed, and the package compiled."""
    node, npm = shutil.which("node"), shutil.which("npm")
    major = _node_major(node) if node else None
    if node is None or npm is None or major is None or major < MIN_NODE_MAJOR:
        found = f"node {major}" if major else "no node"
        pytest.fail(
            f"the TypeScript SDK tests need Node.js >= {MIN_NODE_MAJOR} with npm on PATH "
            f"(found {found}, npm {'present' if npm else 'missing'}); `bash scripts/test.sh` "
            "installs them",
            pytrace=False,
        )
    # Every pytest worker of a run (scripts/test.sh) may get here: one at a time, and the
    # first one builds; the others find dist/ built from the same sources and leave it be (a
    # rebuild deletes dist/ under another worker's running tests).
    with _build_lock():
        lock = hashlib.sha256((PACKAGE / "package-lock.json").read_bytes()).hexdigest()
        stamp = PACKAGE / "node_modules" / ".evora-installed"
        if not stamp.exists() or stamp.read_text() != lock:
            _run([npm, "ci", "--no-audit", "--no-fund"], "npm ci")
            stamp.write_text(lock)
        built = PACKAGE / "dist" / ".evora-built"
        digest = _sources_digest()
        if not built.exists() or built.read_text() != digest:
            # compiled afresh: a test deleted from the sources must not linger in dist/
            shutil.rmtree(PACKAGE / "dist", ignore_errors=True)
            _run([node, "node_modules/typescript/bin/tsc", "-p", "."], "tsc")
            built.write_text(digest)
    return NodeTools(node=node, test_dir=PACKAGE / "dist" / "test")


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """An exclusive lock on building this checkout's package, across processes."""
    name = hashlib.sha256(str(PACKAGE).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"evora-ts-build-{name}.lock", "w") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


def _sources_digest() -> str:
    """What a build is made of: the sources, the tests and tools, the compiler's settings."""
    digest = hashlib.sha256()
    files = [PACKAGE / "tsconfig.json", PACKAGE / "package-lock.json"]
    for folder in ("src", "test", "tools"):
        files += sorted(p for p in (PACKAGE / folder).rglob("*") if p.is_file())
    for path in files:
        digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def npm(*args: str, cwd: Path) -> str:
    """npm's standard output; fails showing npm's output unless it succeeded."""
    command = shutil.which("npm")
    assert command is not None
    done = subprocess.run(
        [command, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def install_packed_sdk(tools: NodeTools, project: Path) -> Path:
    """`npm pack` of the SDK (as `tools` compiled it) installed into a new ESM project at
    `project`, as a user does it; returns the tarball. The package has no runtime
    dependencies, so nothing but the tarball is needed, and no registry."""
    project.mkdir(parents=True)
    [packed] = json.loads(npm("pack", "--json", "--pack-destination", str(project), cwd=PACKAGE))
    tarball: Path = project / packed["filename"]
    (project / "package.json").write_text(
        '{"name": "a-user-project", "private": true, "type": "module"}\n'
    )
    npm("install", "--offline", "--no-audit", "--no-fund", str(tarball), cwd=project)
    return tarball


@dataclass
class TsStack:
    """The services a Node test talks to, and the environment that tells it where they are."""

    settings: Settings
    api: Service
    sweeper: Service
    projector: Service
    dispatcher: Service
    control_url: str = ""
    restarts: int = 0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def env(self) -> dict[str, str]:
        return {
            "EVORA_API_URL": self.api.url,
            "EVORA_DISPATCHER_URL": self.dispatcher.url,
            "EVORA_ADMIN_TOKEN": ADMIN_TOKEN,
            "EVORA_PRODUCER_TOKEN": PRODUCER_TOKEN,
            "EVORA_WORKER_TOKEN": WORKER_TOKEN,
            "EVORA_TEST_CONTROL_URL": self.control_url,
        }

    async def restart_dispatcher(self, down_seconds: float) -> None:
        """Stop the dispatcher, keep it down for `down_seconds`, start it on the same port."""
        async with self._lock:
            port = self.dispatcher.port
            await self.dispatcher.close()
            await asyncio.sleep(down_seconds)
            self.dispatcher = await start_dispatcher(self.settings, port)
            self.restarts += 1


async def start_dispatcher(settings: Settings, port: int = 0) -> Service:
    # As `evora dispatcher` runs it: a handler whose worker disconnected is cancelled.
    app = await create_dispatcher(settings)
    return await serve(app, "dispatcher", handler_cancellation=True, port=port)


@contextlib.asynccontextmanager
async def control_service(stack: TsStack) -> AsyncIterator[str]:
    """`POST /dispatcher/restart?down_seconds=N` on a free loopback port; yields its URL."""

    async def restart(request: web.Request) -> web.Response:
        down = float(request.query.get("down_seconds", "1"))
        await stack.restart_dispatcher(down)
        return web.json_response({"restarts": stack.restarts})

    app = web.Application()
    app.router.add_post("/dispatcher/restart", restart)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def ts_stack(db_url: str, mongo_url: str, mongo_db_name: str) -> AsyncIterator[TsStack]:
    settings = Settings(
        database_url=db_url, mongo_url=mongo_url, mongo_db=mongo_db_name, tokens=TOKENS
    )
    async with contextlib.AsyncExitStack() as services:

        async def started(service: Service) -> Service:
            services.push_async_callback(service.close)
            return service

        api = await started(await serve(await create_api(settings), "api"))
        # Leases that run out are noticed within a fifth of a second.
        tuning = Tuning(max_wait=0.2)
        sweeper = await started(await serve(await create_sweeper(settings, tuning), "sweeper"))
        projector = await started(await serve(await create_projector(settings), "projector"))
        stack = TsStack(
            settings=settings,
            api=api,
            sweeper=sweeper,
            projector=projector,
            dispatcher=await start_dispatcher(settings),
        )
        # The dispatcher of the moment, which a restart replaces.
        services.push_async_callback(lambda: stack.dispatcher.close())
        stack.control_url = await services.enter_async_context(control_service(stack))
        yield stack


async def run_node(
    tools: NodeTools, stack: TsStack, tests: list[Path], extra_env: Mapping[str, str] = {}
) -> str:
    """Runs the compiled Node test files against `stack`; fails showing node's output unless
    every test passed. Returns that output."""
    env = {**os.environ, **stack.env, **extra_env}
    process = await asyncio.create_subprocess_exec(
        tools.node,
        "--test",
        "--test-concurrency=1",
        "--test-reporter=spec",
        *map(str, tests),
        cwd=PACKAGE,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        raw, _ = await asyncio.wait_for(process.communicate(), NODE_RUN_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        raw, _ = await process.communicate()
        output = raw.decode(errors="replace")
        pytest.fail(f"node --test did not finish within {NODE_RUN_TIMEOUT_S}s:\n{output}")
    output = raw.decode(errors="replace")
    print(output)  # shown with -s, and with the failure
    assert process.returncode == 0, f"node --test exited {process.returncode}:\n{output}"
    # node's closing lines: a run that executed nothing must not pass.
    passed = re.search(r"^\S* ?pass (\d+)$", output, re.MULTILINE)
    assert passed and int(passed.group(1)) > 0, f"node ran no test:\n{output}"
    return output
