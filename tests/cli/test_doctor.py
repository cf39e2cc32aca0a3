"""`evora doctor`: each check's verdict and what to do, on a real database, as an operator
runs it (the command in a child process) and, where a verdict needs a figure past a
threshold, with low thresholds in this process."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import orjson

from evora.config import Settings
from evora.protocol.jobs import JobSubmission
from evora.storage import locks
from evora.storage.jobs import JobStore
from evora_services.cli.doctor import Thresholds, run_checks
from tests.cli.commands import evora_async
from tests.conftest import _admin, _with_database
from tests.pgbouncer import pgbouncer, through

CHECKS = [
    "connection",
    "postgres_version",
    "migrations",
    "pooler",
    "long_transactions",
    "dead_tuples",
    "projector_lag",
    "sweeper_leader",
    "projector_leader",
    "clock_skew",
]


async def _doctor_json(db_url: str) -> tuple[int, dict[str, Any]]:
    result = await evora_async("doctor", "--json", env={"EVORA_DATABASE_URL": db_url})
    return result.returncode, orjson.loads(result.stdout)


@contextlib.asynccontextmanager
async def _leaders(db_url: str) -> AsyncIterator[None]:
    """A sweeper's and a projector's leadership locks, held as they hold them."""
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute(
            "SELECT pg_advisory_lock($1), pg_advisory_lock($2)", locks.SWEEPER, locks.PROJECTOR
        )
        yield
    finally:
        await conn.close()


async def test_a_healthy_deployment_passes_and_missing_leaders_fail(db_url: str) -> None:
    status, report = await _doctor_json(db_url)
    assert status == 1 and report["ok"] is False
    verdicts = {c["name"]: c["verdict"] for c in report["checks"]}
    assert list(verdicts) == CHECKS
    assert verdicts["sweeper_leader"] == verdicts["projector_leader"] == "fail"
    leader = next(c for c in report["checks"] if c["name"] == "sweeper_leader")
    assert "evora sweeper" in leader["action"]
    for name in ("connection", "postgres_version", "migrations", "pooler", "projector_lag"):
        assert verdicts[name] == "ok", report

    async with _leaders(db_url):
        status, report = await _doctor_json(db_url)
    assert status == 0 and report["ok"] is True, report
    assert {c["name"]: c["verdict"] for c in report["checks"]}["sweeper_leader"] == "ok"


async def test_text_report_says_what_to_do(db_url: str) -> None:
    result = await evora_async("doctor", env={"EVORA_DATABASE_URL": db_url})
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("OK    connection")
    failed = lines.index(next(line for line in lines if line.startswith("FAIL  sweeper_leader")))
    assert lines[failed + 1].strip().startswith("what to do: start `evora sweeper`")


async def test_missing_migrations_fail_and_say_to_migrate(pg_server_url: str) -> None:
    name = f"doctor_{uuid.uuid4().hex[:12]}"
    await _admin(pg_server_url, f'CREATE DATABASE "{name}"')
    try:
        status, report = await _doctor_json(_with_database(pg_server_url, name))
    finally:
        await _admin(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert status == 1
    migrations = next(c for c in report["checks"] if c["name"] == "migrations")
    assert migrations["verdict"] == "fail" and "0001" in migrations["detail"]
    assert "function file(s) not current" in migrations["detail"]
    assert "evora migrate" in migrations["action"]
    # the checks that read Evora's tables say they cannot, rather than crash the command
    lag = next(c for c in report["checks"] if c["name"] == "projector_lag")
    assert lag["verdict"] == "fail" and lag["detail"].startswith("cannot check")


async def test_a_transaction_holding_xmin_and_unprojected_events_are_named(
    db_url: str, pool: asyncpg.Pool
) -> None:
    await JobStore(pool).submit(JobSubmission(queue="doctor", type="t", payload={}))
    held = await asyncpg.connect(db_url)
    try:
        await held.execute("SET application_name = 'left-open'")
        tx = held.transaction()
        await tx.start()
        await held.fetchval("SELECT pg_current_xact_id()")
        pid = held.get_server_pid()
        limits = Thresholds(xmin_warn_seconds=0, xmin_fail_seconds=0, lag_warn_seconds=0)
        async with asyncio.timeout(30):
            results = {c.name: c for c in await run_checks(Settings(database_url=db_url), limits)}
        await tx.rollback()
    finally:
        await held.close()
    xmin = results["long_transactions"]
    assert xmin.verdict == "fail"
    assert f"pid {pid}, left-open" in xmin.detail
    assert xmin.action is not None and f"pg_terminate_backend({pid})" in xmin.action
    lag = results["projector_lag"]
    assert lag.verdict == "warn", lag
    assert lag.detail.startswith("1 event(s) not projected yet")
    assert "never recorded progress" in lag.detail


async def test_behind_transaction_pooling_it_names_what_the_role_lacks(
    db_url: str, pg_server_url: str
) -> None:
    with pgbouncer(pg_server_url, "transaction") as port:
        pooled = through(db_url, port)
        without_direct = Settings(database_url=pooled, database_pooler="transaction")
        with_direct = without_direct.model_copy(update={"direct_database_url": db_url})
        bare = {c.name: c for c in await run_checks(without_direct)}["pooler"]
        assert bare.verdict == "fail" and "EVORA_DIRECT_DATABASE_URL" in (bare.action or "")
        lacking = {c.name: c for c in await run_checks(with_direct)}["pooler"]
        assert lacking.verdict == "warn", lacking
        assert "statement_timeout" in lacking.detail and "jit" in lacking.detail
        assert "ALTER ROLE <role> SET statement_timeout = '30000'" in (lacking.action or "")
        # as on the role, but for this test's database only
        database = db_url.rsplit("/", 1)[1]
        for name, value in (("statement_timeout", "30s"), ("jit", "off")):
            await _admin(db_url, f'ALTER DATABASE "{database}" SET {name} = {value!r}')
        await _admin(
            db_url, f'ALTER DATABASE "{database}" SET idle_in_transaction_session_timeout = 60000'
        )
    # a new PgBouncer: new server sessions, which start with the database's settings
    with pgbouncer(pg_server_url, "transaction") as port:
        settings = with_direct.model_copy(update={"database_url": through(db_url, port)})
        ready = {c.name: c for c in await run_checks(settings)}["pooler"]
        assert ready.verdict == "ok", ready
        assert (
            "wake-ups by LISTEN and leadership locks on EVORA_DIRECT_DATABASE_URL" in ready.detail
        )
