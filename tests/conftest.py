"""Real servers for the tests, chosen in this order: an explicit URL from the
environment, else testcontainers when a Docker engine answers, else local child processes.
EVORA_PG_BIN_DIR (a leg of the version matrix, scripts/test.sh) names the PostgreSQL to
start as a child process, Docker or not.

PostgreSQL isolation is per test: migrations run once into a template database and every
test gets its own clone, which costs a file copy instead of a migration run.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from pymongo import MongoClient
from pymongo.asynchronous.database import AsyncDatabase

from evora.embedded import LocalMongo, LocalPostgres
from evora.embedded._pgbin import BIN_DIR_ENV
from evora.readmodels.client import mongo_client
from evora.readmodels.layout import Document
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.retention import (
    EVENT_PARTITION_SECONDS,
    EVENT_PARTITIONS_AHEAD,
    MAKE_EVENT_PARTITIONS,
)
from tests.databases import create_database
from tests.scratch import scratch_dir
from tests.servers import Services, start_api, start_dispatcher

MakeDatabase = Callable[[], Awaitable[str]]

_DOCKER_PING_TIMEOUT_S = 3
_TEST_PG_SETTINGS = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"


@functools.cache
def _docker_answers() -> bool:
    # Without DOCKER_HOST or the default socket there is nobody to ask, so skip the import.
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return False
    try:
        client = importlib.import_module("docker").from_env(timeout=_DOCKER_PING_TIMEOUT_S)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _container_class(module: str, name: str) -> Any:
    # testcontainers 4.13 moved the modules under .community; pyproject allows older ones.
    for path in (f"testcontainers.community.{module}", f"testcontainers.{module}"):
        try:
            return getattr(importlib.import_module(path), name)
        except ImportError:
            continue
    raise ImportError(f"testcontainers has no {name}")


def _with_database(dsn: str, database: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{database}"))


async def _admin(dsn: str, statement: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def _create(dsn: str, name: str, template: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await create_database(conn, name, template)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """Admin DSN (database ``postgres``) of a server where tests may create databases."""
    if url := os.environ.get("EVORA_TEST_DATABASE_URL"):
        yield url
    elif _docker_answers() and not os.environ.get(BIN_DIR_ENV):
        container = _container_class("postgres", "PostgresContainer")(
            "postgres:18", username="postgres", password="postgres", dbname="postgres", driver=None
        )
        container.with_command(f"postgres -c max_connections=200 {_TEST_PG_SETTINGS}")
        with container:
            yield container.get_connection_url()
    else:
        with (
            tempfile.TemporaryDirectory(prefix="evora-test-pg-", dir=scratch_dir()) as tmp,
            LocalPostgres(Path(tmp) / "data", durable=False) as server,
        ):
            yield server.dsn()


@pytest.fixture
async def empty_db_url(pg_server_url: str) -> AsyncIterator[str]:
    """A database of its own made from template0, not even Evora's schema in it: for a test
    that migrates, restores or upgrades one itself. Dropped after the test."""
    name = f"empty_{uuid.uuid4().hex}"
    await _create(pg_server_url, name, "template0")
    try:
        yield _with_database(pg_server_url, name)
    finally:
        await _admin(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
async def template_db(pg_server_url: str) -> AsyncIterator[str]:
    """Name of a database with all migrations applied, for cloning."""
    # Imported here so that tests needing no database do not depend on the storage layer.
    from evora.storage.migrate import apply_migrations

    name = f"evora_template_{uuid.uuid4().hex[:12]}"
    await _admin(pg_server_url, f'CREATE DATABASE "{name}"')
    try:
        await apply_migrations(_with_database(pg_server_url, name))
        yield name
    finally:
        await _admin(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# The folders whose tests drive jobs through the system: at the end of each of their tests
# the auditor checks every database the test made (docs/audit.md), so any test that drives
# load is also a test of every invariant.
_AUDITED = frozenset(
    {
        "api",
        "audit",
        "cli",
        "dispatcher",
        "e2e",
        "edge",
        "fuzz",
        "integration",
        "pipeline",
        "projector",
        "sdk",
        "sql",
        "sweeper",
        "tracing",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "audit_skip(reason): the test corrupts the history on purpose; the auditor does not "
        "check its databases at teardown",
    )


# The files a full run spends longest in (their test time in its --durations list, 35-160 s
# each), handed to the xdist workers first: scripts/test.sh passes --no-loadscope-reorder, so
# the workers take files in collection order, and none of these starts last while the other
# worker has nothing left to do (xdist's own order, most tests first, put the one-test files
# of a minute or two at the very end). A file renamed here only loses its place.
LONGEST_FIRST = (
    "tests/fuzz/test_api_schema.py",
    "tests/fuzz/test_dispatcher_schema.py",
    "tests/pipeline/test_cluster.py",
    "tests/cli/test_readme.py",
    "tests/e2e/test_random_workload.py",
    "tests/e2e/test_replicated.py",
    "tests/cli/test_operator_commands.py",
    "tests/projector/test_long_transactions.py",
    "tests/typescript/test_sdk.py",
    "tests/integration/test_plan_traps.py",
    "tests/bench/test_bench_pressure.py",
    "tests/bench/test_bench_smoke.py",
    "tests/dashboard/test_browser.py",
    "tests/integration/test_dependencies.py",
    "tests/deploy/test_packaging.py",
    "tests/sweeper/test_scheduler_processes.py",
    "tests/sweeper/test_flow_buckets.py",
    "tests/projector/test_mongo_crash.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: n for n, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))


def _audited(request: pytest.FixtureRequest) -> bool:
    if request.node.get_closest_marker("audit_skip") is not None:
        return False
    parts = Path(request.node.path).relative_to(Path(__file__).parent).parts
    return len(parts) > 1 and parts[0] in _AUDITED


async def _audit_database(dsn: str) -> None:
    from evora.storage.audit import audit

    report = await audit(dsn)
    if not report.ok:
        pytest.fail(f"the audit of the test's database found violations:\n{report.text()}")


@pytest.fixture
async def make_db_url(
    pg_server_url: str, template_db: str, request: pytest.FixtureRequest
) -> AsyncIterator[MakeDatabase]:
    """Creates migrated databases on demand; all are audited (in the folders that drive
    load, unless the test is marked `audit_skip`) and dropped after the test."""
    created: list[str] = []

    async def make() -> str:
        name = f"test_{uuid.uuid4().hex}"
        await _create(pg_server_url, name, template_db)
        created.append(name)
        return _with_database(pg_server_url, name)

    yield make
    try:
        if _audited(request):
            for name in created:
                await _audit_database(_with_database(pg_server_url, name))
    finally:
        for name in created:
            await _admin(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def db_url(make_db_url: MakeDatabase) -> str:
    """DSN of a freshly migrated database that only this test uses."""
    return await make_db_url()


class Clock:
    """The clock of one test database: `evora.clock_now()`, which every time-dependent statement
    reads (migration 0009), runs `offset` seconds ahead of the real one. The offset is a
    database setting, so every connection opened after `advance`, a service's included,
    sees the same time; the pools named in `renew` reopen their connections to see it.
    job_events' partitions are made ahead of the new time, as the sweeper would have made
    them while that time passed."""

    def __init__(self, admin_dsn: str, dsn: str, renew: Sequence[asyncpg.Pool] = ()) -> None:
        self._admin_dsn = admin_dsn
        self._dsn = dsn
        self._database = urlsplit(dsn).path.lstrip("/")
        self._renew = list(renew)
        self.offset = 0.0

    async def advance(self, seconds: float, *, partitions: bool = True) -> None:
        self.offset += seconds
        await _admin(
            self._admin_dsn,
            f'ALTER DATABASE "{self._database}" SET evora.clock_offset = '
            f"'{self.offset!r} seconds'",
        )
        if partitions:
            conn = await asyncpg.connect(self._dsn)
            try:
                await conn.execute(
                    MAKE_EVENT_PARTITIONS, EVENT_PARTITION_SECONDS, EVENT_PARTITIONS_AHEAD
                )
            finally:
                await conn.close()
        for pool in self._renew:
            await pool.expire_connections()


@pytest.fixture
async def clock(pg_server_url: str, db_url: str, pool: asyncpg.Pool) -> Clock:
    """The test database's clock; `pool` sees each advance at once."""
    return Clock(pg_server_url, db_url, [pool])


@pytest.fixture(scope="session")
def mongo_url() -> Iterator[str]:
    if url := os.environ.get("EVORA_TEST_MONGO_URL"):
        yield url
    elif _docker_answers():
        with _container_class("mongodb", "MongoDbContainer")("mongo:7") as container:
            yield container.get_connection_url()
    else:
        with (
            tempfile.TemporaryDirectory(prefix="evora-test-mongo-", dir=scratch_dir()) as tmp,
            LocalMongo(Path(tmp)) as server,
        ):
            yield server.url


@pytest.fixture(scope="session")
def _mongo_admin(mongo_url: str) -> Iterator[MongoClient[dict[str, Any]]]:
    client: MongoClient[dict[str, Any]] = MongoClient(mongo_url, serverSelectionTimeoutMS=10_000)
    with client:
        yield client


@pytest.fixture
def mongo_db_name(_mongo_admin: MongoClient[dict[str, Any]]) -> Iterator[str]:
    """A database name no other test uses; the database is dropped afterwards."""
    name = f"evora_test_{uuid.uuid4().hex[:12]}"
    yield name
    _mongo_admin.drop_database(name)


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(db_url, min_size=1, max_size=8)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def plain_conn(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection of its own to the test's database, plain asyncpg (no Evora codecs)."""
    conn = await asyncpg.connect(db_url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def store(pool: asyncpg.Pool) -> AsyncIterator[JobStore]:
    store = JobStore(pool)
    yield store
    await store.close()


@pytest.fixture
async def mongo(mongo_url: str, mongo_db_name: str) -> AsyncIterator[AsyncDatabase[Document]]:
    """The test's own MongoDB database, through the client every service uses."""
    client = mongo_client(mongo_url, "evora-tests")
    try:
        yield client[mongo_db_name]
    finally:
        await client.close()


@pytest.fixture
async def services(db_url: str, mongo_url: str, mongo_db_name: str) -> AsyncIterator[Services]:
    """The real api and dispatcher, served in this event loop on the test's database."""
    api = await start_api(db_url, mongo_url=mongo_url, mongo_db=mongo_db_name)
    try:
        dispatcher = await start_dispatcher(db_url)
        try:
            yield Services(api, dispatcher)
        finally:
            await dispatcher.close()
    finally:
        await api.close()


@contextlib.asynccontextmanager
async def whole_event_images(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Inside it, every event carries the job's whole image, as every event did before
    evora.event_image() (a history written before the upgrade); after it, the events carry
    what the function file says again."""
    narrow = await pool.fetchval(
        "SELECT pg_get_functiondef('evora.event_image(evora.jobs, evora.job_state)'::regprocedure)"
    )
    await pool.execute(
        "CREATE OR REPLACE FUNCTION evora.event_image(j evora.jobs, from_state evora.job_state)"
        " RETURNS evora.job_image LANGUAGE sql IMMUTABLE AS $$ SELECT evora.job_image(j) $$"
    )
    try:
        yield
    finally:
        await pool.execute(narrow)
