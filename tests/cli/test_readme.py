"""The README's first section gets a newcomer from a clone to a job completed by a worker:
its shell lines, read from README.md itself, run as written, in order, on a machine where
the default ports 8080 and 8081 are taken.

And every other code block of README.md, docs/*.md and the TypeScript SDK's README runs as
pasted against one `evora dev`, or says in its info string why it does not (README.md,
"Code blocks in these docs")."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.commands import REPO, clean_environment, stop_group, wait_until_up
from tests.typescript.conftest import PACKAGE, NodeTools, install_packed_sdk

# What the lines use from the repository besides the code: the scripts, the example worker.
COPIED = ("README.md", "pyproject.toml", "scripts", "examples")


def first_section_blocks(readme: str) -> list[str]:
    """The ```bash blocks of the first `## ` section."""
    sections = re.split(r"^## ", readme, flags=re.MULTILINE)
    return re.findall(r"^```bash\n(.*?)^```", sections[1], flags=re.MULTILINE | re.DOTALL)


@contextmanager
def default_ports_taken() -> Iterator[None]:
    """8080 and 8081 held by someone else (or already taken on this machine)."""
    with ExitStack() as stack:
        for port in (8080, 8081):
            holder = stack.enter_context(socket.socket())
            try:
                holder.bind(("127.0.0.1", port))
                holder.listen()
            except OSError:
                pass  # taken already, which is the point
        yield


def _clone(target: Path) -> None:
    """What a clone holds for these lines, with a .venv that `scripts/run.sh` finds complete:
    this test's interpreter and packages, and this tree's code; installing them takes
    minutes and the network, and is measured apart (docs, the final report)."""
    target.mkdir()
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, target / name)
        else:
            shutil.copy(source, target / name)
    venv = target / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = (venv / "lib").glob("python3*/site-packages")
    paths = [REPO / "shared", REPO / "services", Path(sysconfig.get_paths()["purelib"])]
    (site / "evora_test_paths.pth").write_text("".join(f"{p}\n" for p in paths))
    evora = venv / "bin" / "evora"
    evora.write_text(
        f"#!{venv / 'bin' / 'python'}\n"
        "import sys\nfrom evora_services.cli import main\nsys.exit(main())\n"
    )
    evora.chmod(0o755)
    # The embedded MongoDB-wire server is a program of its package, found beside python.
    mongo_server = Path(sys.executable).parent / "secantusd-py"
    (venv / "bin" / mongo_server.name).symlink_to(mongo_server)
    # The stamp scripts/_env.sh's ensure_venv compares: pyproject.toml and the extra's lock.
    # A stale one made `scripts/run.sh` reinstall into this .venv (pip: most of this test's CPU).
    installed = (target / "pyproject.toml").read_bytes()
    installed += (target / "scripts" / "locks" / "local.txt").read_bytes()
    digest = hashlib.sha256(installed).hexdigest()
    (venv / ".evora-installed-local").write_text(digest + "\n")


@dataclass(frozen=True)
class FirstTerminal:
    """The first terminal's lines running in a clone: what they printed once up, and the
    environment the lines of both terminals run in."""

    clone: Path
    banner: str
    env: dict[str, str]


@pytest.fixture(scope="module")
def first_terminal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FirstTerminal]:
    """The README's first terminal, run as written in a clone while 8080 and 8081 are taken.
    The `evora dev` it starts is also the one every other block runs against (`dev`): one
    start (initdb, migrations, the databases and four services) instead of two."""
    first_terminal_lines = first_section_blocks((REPO / "README.md").read_text())[0]
    tmp_path = tmp_path_factory.mktemp("first-section")
    clone = tmp_path / "evora"
    _clone(clone)
    env = clean_environment()  # the clone's .venv alone says where the code is
    log = tmp_path / "first-terminal.log"
    with default_ports_taken():
        with log.open("wb") as log_file:
            system = subprocess.Popen(
                ["bash", "-c", first_terminal_lines],
                cwd=clone,
                env=env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            yield FirstTerminal(clone, wait_until_up(system, log), env)
        finally:
            stop_group(system)
    assert not (clone / ".evora" / "env").exists()  # removed when evora dev stopped


def test_the_first_section_runs_as_written(first_terminal: FirstTerminal) -> None:
    second_terminal = first_section_blocks((REPO / "README.md").read_text())[1]
    banner = first_terminal.banner
    assert "pip install" not in banner, banner  # the clone's .venv was found complete
    # What it does while the databases start, and loudly that the ports were replaced.
    assert "starting the embedded PostgreSQL in " in banner
    assert "starting the embedded MongoDB-wire server in " in banner
    for port, service, variable in ((8080, "api", "API"), (8081, "dispatcher", "DISPATCHER")):
        assert re.search(
            rf"WARNING evora.dev: port {port} is in use: the {service} listens on \d+ "
            rf"instead \(set EVORA_{variable}_PORT to choose one\)",
            banner,
        ), banner
    assert "dashboard   http://127.0.0.1:" in banner
    assert "evora worker examples.worker_example --queues demo" in banner
    second = subprocess.Popen(
        ["bash", "-e", "-c", second_terminal],
        cwd=first_terminal.clone,
        env=first_terminal.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out_bytes, err_bytes = second.communicate(timeout=120)
    finally:
        stop_group(second)  # the worker too, should the lines have stopped before `kill %1`
    out, err = out_bytes.decode(), err_bytes.decode()
    assert second.returncode == 0, out + err
    assert re.search(r"^state\s+COMPLETED$", out, re.MULTILINE), out
    assert re.search(r'^result\s+\{"hello":"world"\}$', out, re.MULTILINE), out
    assert re.search(r"\bcompleted\b", out), out  # the events
    # The default ports were taken, so the system runs elsewhere and said where.
    env_file = (first_terminal.clone / ".evora" / "env").read_text()
    assert "EVORA_API_URL=http://127.0.0.1:8080\n" not in env_file


# The pages whose code blocks a newcomer copies.
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), PACKAGE / "README.md")
# Output and data: never run.
OUTPUT = frozenset({"text", "console", "json", "yaml"})
# In a block's info string after the language: a fragment, or one needing what this machine
# does not have (Docker, Kubernetes, another language's driver).
NOT_RUN = "not-run"
# A block that calls this serves until it is stopped: it runs a few seconds, then gets SIGTERM.
SERVES = re.compile(r"\bworker\.run\(\)")
SERVE_SECONDS = 5
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    info: tuple[str, ...]
    code: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def language(self) -> str:
        return self.info[0] if self.info else ""


def code_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file (CommonMark fences), in order."""
    blocks = []
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        index += 1
        if opening is None:
            continue
        start, indent, fence = index, len(opening["indent"]), opening["fence"]
        closing = re.compile(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$")
        while index < len(lines) and not closing.match(lines[index]):
            index += 1
        body = [re.sub(rf"^ {{0,{indent}}}", "", line) for line in lines[start:index]]
        blocks.append(Block(path, start, tuple(opening["info"].split()), "\n".join(body) + "\n"))
        index += 1
    return blocks


def _runs_elsewhere(block: Block) -> bool:
    """The first section's blocks: test_the_first_section_runs_as_written runs them."""
    readme = (REPO / "README.md").read_text()
    return block.path == REPO / "README.md" and block.code in first_section_blocks(readme)


ALL_BLOCKS = [block for path in DOCS for block in code_blocks(path)]
RUN = [
    block
    for block in ALL_BLOCKS
    if block.language not in OUTPUT and NOT_RUN not in block.info and not _runs_elsewhere(block)
]


def test_every_block_runs_or_says_why_not() -> None:
    runners = {"bash", "sh", "python", "ts", "sql"}
    unmarked = [
        f"{block.name}: ```{' '.join(block.info)}" for block in RUN if block.language not in runners
    ]
    assert not unmarked, (
        "code blocks that no test runs: give each a language this test runs "
        f"({', '.join(sorted(runners))}), an output one ({', '.join(sorted(OUTPUT))}), or "
        f"`{NOT_RUN}` after the language:\n" + "\n".join(unmarked)
    )
    assert len(ALL_BLOCKS) > 40 and len(RUN) > 5  # the parser found the blocks
    # `not-run:` or `not-run,` is not the marker: such a block would run (and fail) instead
    misspelt = [
        f"{block.name}: ```{' '.join(block.info)}"
        for block in ALL_BLOCKS
        if any(word.startswith(NOT_RUN) and word != NOT_RUN for word in block.info)
    ]
    assert not misspelt, f"write `{NOT_RUN}` as a word of its own:\n" + "\n".join(misspelt)


@dataclass(frozen=True)
class Dev:
    """One `evora dev` for all the blocks, and the environment `. .evora/env` gives a shell."""

    env: dict[str, str]
    workdir: Path


@pytest.fixture(scope="module")
def dev(first_terminal: FirstTerminal) -> Dev:
    """The first section's `evora dev`, and a shell in its clone that sourced `.evora/env`."""
    exports = {}
    for line in (first_terminal.clone / ".evora" / "env").read_text().splitlines():
        name, value = shlex.split(line.removeprefix("export "))[0].split("=", 1)
        exports[name] = value
    env = clean_environment(exports)
    # The venv's `evora` and `python` first, as in a shell where the venv is active.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    return Dev(env, first_terminal.clone)


@dataclass(frozen=True)
class TsBuild:
    """The TypeScript blocks compiled in a user's ESM project with the packed SDK installed:
    each block's file, and what tsc said."""

    sources: dict[str, Path]
    status: int
    output: str


@pytest.fixture(scope="module")
def ts_build(node_tools: NodeTools, tmp_path_factory: pytest.TempPathFactory) -> TsBuild:
    """Every TypeScript block compiled by one tsc: each block is a module of its own (an ESM
    project), so compiling them together checks each as compiling it alone does, and tsc's
    start (seconds of CPU: it loads the compiler and the standard library's types) is paid
    once instead of once per block."""
    project = tmp_path_factory.mktemp("ts-snippets") / "project"
    install_packed_sdk(node_tools, project)
    sources = {}
    for index, block in enumerate(block for block in RUN if block.language == "ts"):
        sources[block.name] = project / f"snippet{index}.ts"
        sources[block.name].write_text(block.code)
    compiled = subprocess.run(
        [
            node_tools.node,
            str(PACKAGE / "node_modules" / "typescript" / "bin" / "tsc"),
            "--module",
            "nodenext",
            "--target",
            "es2022",
            "--strict",
            "--skipLibCheck",
            "--typeRoots",
            str(PACKAGE / "node_modules" / "@types"),
            "--types",
            "node",
            *map(str, sources.values()),
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return TsBuild(sources, compiled.returncode, compiled.stdout)


# SQL blocks run as one script on the database `evora dev` uses.
RUN_SQL = """\
import asyncio, os, sys
import asyncpg

async def main() -> None:
    conn = await asyncpg.connect(os.environ["EVORA_DATABASE_URL"])
    try:
        await conn.execute(open(sys.argv[1]).read())
    finally:
        await conn.close()

asyncio.run(main())
"""


def _command(block: Block, dev: Dev, request: pytest.FixtureRequest) -> list[str]:
    """How a newcomer runs the block: its text in a file, run by the language's tool."""
    suffix = {"bash": "sh", "sh": "sh", "python": "py", "sql": "sql", "ts": "ts"}[block.language]
    if block.language == "ts":
        build: TsBuild = request.getfixturevalue("ts_build")
        source = build.sources[block.name]
        # tsc names the file of each error at the start of its line (cwd is the project).
        own = [line for line in build.output.splitlines() if line.startswith(source.name)]
        assert not own, f"{block.name} does not compile:\n{build.output}"
        # An error in no block's file (the options, the SDK's types) fails every block.
        others = [line for line in build.output.splitlines() if line.startswith("snippet")]
        assert build.status == 0 or others, f"tsc failed:\n{build.output}"
        tools: NodeTools = request.getfixturevalue("node_tools")
        return [tools.node, str(source.with_suffix(".js"))]
    script = dev.workdir / f"snippet.{suffix}"
    script.write_text(block.code)
    if block.language == "python":
        return [sys.executable, str(script)]
    if block.language == "sql":
        return [sys.executable, "-c", RUN_SQL, str(script)]
    return ["bash", "-e", str(script)]


def _run(command: list[str], dev: Dev, serves: bool) -> tuple[int | None, str]:
    """The exit status and the output; a serving block is stopped with SIGTERM after a few
    seconds (None when it had exited by itself before)."""
    process = subprocess.Popen(
        command,
        cwd=dev.workdir,
        env=dev.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        if serves:
            try:
                process.wait(SERVE_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGTERM)
            else:
                return None, process.communicate()[0].decode(errors="replace")
        out, _ = process.communicate(timeout=120)
        return process.returncode, out.decode(errors="replace")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.parametrize("block", RUN, ids=[block.name for block in RUN])
def test_the_block_runs_as_pasted(block: Block, dev: Dev, request: pytest.FixtureRequest) -> None:
    command = _command(block, dev, request)
    serves = SERVES.search(block.code) is not None
    # Twice: a newcomer runs a snippet again (an idempotency key must replay, not conflict).
    for _ in range(1 if serves else 2):
        status, output = _run(command, dev, serves)
        if serves:
            assert status is not None, f"{block.name} stopped before SIGTERM:\n{output}"
        assert status == 0, f"{block.name} exited {status}:\n{output}"
        assert "Traceback" not in output, output
