"""End-to-end harness: the real `evora api` and `evora dispatcher` apps (in this process
through `serve_app` on loopback port 0, or as real `evora` child processes where a process
has to be killed or restarted) on a real PostgreSQL, driven only through the real SDK
(`evora.Client`, `evora.Worker`) or raw HTTP.

Nothing here sleeps to synchronise: `until` polls something the system shows (a job's
state in PostgreSQL, a metric, a log line, a file a handler wrote) with a bounded deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from evora import Client, Handlers, RetryBackoff, Worker
from evora_services.dispatcher.state import DISPATCH
from tests.databases import create_database
from tests.polling import Condition, until
from tests.servers import (
    ADMIN_TOKEN,
    PRODUCER_TOKEN,
    TOKENS,
    WORKER_TOKEN,
    Service,
    start_api,
    start_dispatcher,
)

WORKER_HEADERS = {"Authorization": f"Bearer {WORKER_TOKEN}"}

# Retries between failed claims/acks wait tenths of seconds here, not the defaults.
FAST = RetryBackoff(initial=0.05, max_delay=0.5)


# -- services in this process ------------------------------------------------------------


def waiting_polls(dispatcher: Service, queue: str) -> int:
    """Long-polls the in-process dispatcher holds for `queue` right now."""
    return dispatcher.app[DISPATCH].wakeups.waiting().get(queue, 0)


def polls_waiting(dispatcher: Service, queue: str, count: int) -> Callable[[], bool]:
    """Condition: the in-process dispatcher holds `count` long-polls for `queue`."""
    return lambda: waiting_polls(dispatcher, queue) == count


async def scrape(http: aiohttp.ClientSession, base_url: str) -> dict[tuple[str, ...], float]:
    """`GET /metrics` of a service: {(sample name, label=value, ...): value}."""
    async with http.get(base_url + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    samples: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[(sample.name, *labels)] = sample.value
    return samples


# -- the whole stack ---------------------------------------------------------------------


@dataclass
class Stack:
    db_url: str
    pool: asyncpg.Pool
    api: Service
    dispatcher_url: str
    client: Client  # producer token
    admin: Client  # admin token
    http: aiohttp.ClientSession
    dispatcher: Service | None = None  # None when the dispatcher is a child process
    _workers: list[tuple[Worker, asyncio.Task[None]]] = field(default_factory=list)

    def worker(self, handlers: Handlers, queues: Iterable[str], **options: Any) -> Worker:
        settings: dict[str, Any] = {
            "concurrency": 4,
            "wait_seconds": 5.0,
            "grace_period": 10.0,
            "backoff": FAST,
            "request_timeout": 5.0,
            **options,
        }
        return Worker(
            self.dispatcher_url, WORKER_TOKEN, list(queues), handlers=handlers, **settings
        )

    def start(self, worker: Worker) -> asyncio.Task[None]:
        """Serve `worker` in the background; it is stopped when the test ends."""
        task = asyncio.create_task(worker.serve(), name=f"e2e-{worker.settings.worker_id}")
        self._workers.append((worker, task))
        return task

    def check_workers(self) -> None:
        """A worker that died on its own fails the test at once instead of at a deadline."""
        for worker, task in self._workers:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise AssertionError(f"worker {worker.settings.worker_id} died") from (
                    task.exception()
                )

    async def until(self, condition: Condition, *, within: float, what: str) -> None:
        async def checked() -> bool:
            self.check_workers()
            outcome = condition()
            return outcome if isinstance(outcome, bool) else await outcome

        await until(checked, within=within, what=what)

    async def stop_workers(self) -> None:
        workers, self._workers = self._workers, []
        for worker, task in workers:
            await asyncio.wait_for(worker.stop(), 30)
            with contextlib.suppress(Exception):
                await task

    async def states(self, queue: str) -> Counter[str]:
        rows = await self.pool.fetch(
            "SELECT state::text AS state, count(*) AS n FROM evora.jobs WHERE queue = $1 GROUP"
            " BY 1",
            queue,
        )
        return Counter({row["state"]: int(row["n"]) for row in rows})

    async def wait_for_states(
        self, queue: str, expected: Mapping[str, int], *, within: float
    ) -> None:
        want = Counter(expected)

        async def reached() -> bool:
            return await self.states(queue) == want

        await self.until(reached, within=within, what=f"{queue} jobs in states {dict(want)}")

    async def event_names(self, job_id: str) -> list[str]:
        """A job's events through the api, oldest first."""
        return [e["event"] for e in await self.client.events(job_id)]


@contextlib.asynccontextmanager
async def open_stack(
    db_url: str, pool: asyncpg.Pool, *, dispatcher_url: str | None = None
) -> AsyncIterator[Stack]:
    """api in this process; the dispatcher too unless `dispatcher_url` names one."""
    api = await start_api(db_url)
    dispatcher = None if dispatcher_url else await start_dispatcher(db_url)
    try:
        async with (
            Client(api.url, PRODUCER_TOKEN, timeout=15, retry_backoff=FAST) as client,
            Client(api.url, ADMIN_TOKEN, timeout=15, retry_backoff=FAST) as admin,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http,
        ):
            stack = Stack(
                db_url=db_url,
                pool=pool,
                api=api,
                dispatcher_url=dispatcher_url or (dispatcher.url if dispatcher else ""),
                client=client,
                admin=admin,
                http=http,
                dispatcher=dispatcher,
            )
            try:
                yield stack
            finally:
                await stack.stop_workers()
    finally:
        if dispatcher is not None:
            await dispatcher.close()
        await api.close()


@pytest.fixture
async def stack(db_url: str, pool: asyncpg.Pool) -> AsyncIterator[Stack]:
    """api and dispatcher in this process, on a fresh database."""
    async with open_stack(db_url, pool) as s:
        yield s


# -- child processes ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def evora_command(*args: str) -> list[str]:
    """The installed `evora` console script, else the same entry point through -m."""
    script = Path(sys.executable).with_name("evora")
    if script.exists():
        return [str(script), *args]
    return [sys.executable, "-m", "evora_services.cli", *args]


def child_env(**variables: str) -> dict[str, str]:
    """This environment without any EVORA_* setting, plus `variables`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVORA_")}
    env.update(variables)
    return env


@dataclass
class Child:
    name: str
    process: asyncio.subprocess.Process
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    def send(self, sig: int) -> None:
        self.process.send_signal(sig)

    async def until_ready(self, http: aiohttp.ClientSession, url: str) -> None:
        """Wait until the service at `url` answers /readyz with 200; fail at once, with its
        log, if it exits first."""

        async def ready() -> bool:
            if not self.running:
                raise AssertionError(f"{self.name} exited early:\n{self.output()}")
            try:
                async with http.get(f"{url}/readyz") as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await until(ready, within=30, what=f"{self.name} is ready")

    async def wait(self, within: float) -> int:
        try:
            return await asyncio.wait_for(self.process.wait(), within)
        except TimeoutError:
            raise AssertionError(
                f"{self.name} did not exit within {within}s; its log:\n{self.output()}"
            ) from None


class Children:
    """Child processes of one test; whatever still runs at its end is killed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._all: list[Child] = []

    async def spawn(self, name: str, command: list[str], env: dict[str, str]) -> Child:
        log = self.directory / f"{name}-{len(self._all)}.log"
        with log.open("wb") as sink:
            process = await asyncio.create_subprocess_exec(
                *command,
                cwd=self.directory,  # also keeps a stray .env of the repo out
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=sink,
                stderr=asyncio.subprocess.STDOUT,
            )
        child = Child(name, process, log)
        self._all.append(child)
        return child

    async def close(self) -> None:
        for child in self._all:
            if child.running:
                child.process.kill()
            await child.process.wait()


@pytest.fixture
async def children(tmp_path: Path) -> AsyncIterator[Children]:
    spawned = Children(tmp_path)
    try:
        yield spawned
    finally:
        await spawned.close()


async def spawn_service(
    children: Children,
    http: aiohttp.ClientSession,
    db_url: str,
    service: str,
    port: int,
    **variables: str,
) -> Child:
    """`evora <service>` (api, dispatcher, sweeper, projector) as a child process listening
    on `port`, with extra EVORA_* `variables`, returned once its /readyz answers 200."""
    env = child_env(
        EVORA_DATABASE_URL=db_url,
        EVORA_TOKENS=TOKENS,
        EVORA_HOST="127.0.0.1",
        EVORA_LOG_LEVEL="INFO",
        **{f"EVORA_{service.upper()}_PORT": str(port)},
        **variables,
    )
    child = await children.spawn(service, evora_command(service), env)
    await child.until_ready(http, f"http://127.0.0.1:{port}")
    return child


async def spawn_dispatcher(
    children: Children, http: aiohttp.ClientSession, db_url: str, port: int
) -> Child:
    """`evora dispatcher` as a child process, returned once its /readyz answers 200."""
    return await spawn_service(children, http, db_url, "dispatcher", port)


# -- databases for a whole module --------------------------------------------------------


def _with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


@pytest.fixture(scope="module")
async def module_db_url(pg_server_url: str, template_db: str) -> AsyncIterator[str]:
    """A migrated database shared by one test module."""
    name = f"test_e2e_{uuid.uuid4().hex}"
    admin = await asyncpg.connect(pg_server_url)
    try:
        await create_database(admin, name, template_db)
        yield _with_database(pg_server_url, name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


class LogRecords(logging.Handler):
    """Collects the messages of one logger, for conditions on what a component said."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def saw(self, fragment: str) -> bool:
        return any(fragment in message for message in self.messages)


@pytest.fixture
def worker_log() -> Iterator[LogRecords]:
    records = LogRecords()
    logger = logging.getLogger("evora.worker")
    logger.addHandler(records)
    previous = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        logger.removeHandler(records)
        logger.setLevel(previous)
