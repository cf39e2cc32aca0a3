"""The sweeper as a service: health, readiness, metrics, configuration, and the `evora
sweeper` process shutting down gracefully on SIGTERM (lock released, connections closed)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys

import aiohttp
import asyncpg
import pytest

from evora.config import ConfigError, load_settings
from evora.storage.jobs import JobStore
from evora_services.sweeper import main
from tests.conftest import Clock
from tests.polling import until
from tests.sweeper.conftest import (
    TOKENS,
    StartSweeper,
    claimed,
)

METRIC_NAMES = (
    'evora_sweeper_leases_expired_total{outcome="requeued"}',
    'evora_sweeper_leases_expired_total{outcome="dead_lettered"}',
    'evora_sweeper_leases_expired_total{outcome="cancelled"}',
    'evora_sweeper_timed_out_total{outcome="requeued"}',
    'evora_sweeper_timed_out_total{outcome="dead_lettered"}',
    'evora_sweeper_timed_out_total{outcome="cancelled"}',
    "evora_sweeper_ttls_expired_total",
    'evora_sweeper_pruned_total{kind="completed"}',
    'evora_sweeper_pruned_total{kind="cancelled"}',
    'evora_sweeper_pruned_total{kind="dlq"}',
    'evora_sweeper_pruned_total{kind="idempotency_keys"}',
    "evora_sweeper_last_run_timestamp_seconds",
    "evora_sweeper_active",
    "evora_sweeper_oldest_writing_transaction_seconds",
    "evora_jobs_dead_tuples",
)


async def test_health_readiness_and_metrics(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    job = await claimed(store)
    await clock.advance(job["lease_seconds"] + 1)
    running = await start_sweeper()
    assert (await running.get("/healthz"))[0] == 200
    assert (await running.get("/readyz"))[0] == 200
    await until(lambda: running.active, "the sweeper to become active")

    await until(
        lambda: running.metric("evora_sweeper_leases_expired_total", outcome="requeued") == 1,
        "the lease to be expired",
    )
    # The pass that expired it records its end only when it is over.
    await until(
        lambda: running.metric("evora_sweeper_last_run_timestamp_seconds") > 0, "a whole pass"
    )
    status, text = await running.get("/metrics")
    assert status == 200
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    for name in METRIC_NAMES:
        assert name in samples, name
    assert samples['evora_sweeper_leases_expired_total{outcome="requeued"}'] == 1
    assert samples["evora_sweeper_active"] == 1
    assert samples["evora_sweeper_last_run_timestamp_seconds"] > 0


async def test_readiness_needs_current_migrations(
    start_sweeper: StartSweeper, pool: asyncpg.Pool
) -> None:
    running = await start_sweeper()
    await pool.execute("DELETE FROM evora.migrations WHERE version = 2")
    status, body = await running.get("/readyz")
    assert status == 503 and "schema" in body


async def test_database_health_gauges(start_sweeper: StartSweeper, pool: asyncpg.Pool) -> None:
    running = await start_sweeper()
    async with pool.acquire() as conn:
        # A transaction that wrote (has an xid) and stays open pins the outbox horizon.
        writer = conn.transaction()
        await writer.start()
        await conn.execute("SELECT pg_current_xact_id()")
        try:
            await until(
                lambda: running.metric("evora_sweeper_oldest_writing_transaction_seconds") > 0.3,
                "the open transaction's age to show",
            )
        finally:
            await writer.rollback()
    await until(
        lambda: running.metric("evora_sweeper_oldest_writing_transaction_seconds") < 0.3,
        "the gauge to drop once it ended",
    )

    async with pool.acquire() as conn:
        # Dead row versions in jobs: rows inserted by a transaction that rolled back.
        rolled_back = conn.transaction()
        await rolled_back.start()
        await conn.execute(
            "INSERT INTO evora.jobs (id, queue, type, payload, max_attempts, lease_seconds, "
            "backoff_initial, backoff_max, backoff_multiplier, run_at) "
            "SELECT gen_random_uuid(), 'q', 't', '{}', 1, 1, 1, 1, 1, now() "
            "FROM generate_series(1, 20)"
        )
        await rolled_back.rollback()
        await conn.execute("SELECT pg_stat_force_next_flush()")
        await conn.execute("SELECT 1")
    dead = await pool.fetchval(
        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'evora.jobs'::regclass"
    )
    assert dead >= 20
    await until(
        lambda: running.metric("evora_jobs_dead_tuples") >= 20, "dead tuples to be exported"
    )


def test_retention_windows_are_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVORA_RETENTION_DLQ_SECONDS", "10")
    with pytest.raises(ConfigError, match="EVORA_RETENTION_DLQ_SECONDS"):
        load_settings()
    monkeypatch.setenv("EVORA_RETENTION_DLQ_SECONDS", "120")
    monkeypatch.setenv("EVORA_RETENTION_COMPLETED_SECONDS", "3600")
    settings = load_settings()
    assert (settings.retention_dlq_seconds, settings.retention_completed_seconds) == (120, 3600)
    assert settings.retention_cancelled_seconds == 86_400
    assert settings.retention_idempotency_seconds == 604_800


def test_lock_keys_are_distinct() -> None:
    """A shared key would let the sweeper and another singleton stand each other by."""
    from evora.storage import locks

    keys = [v for k, v in vars(locks).items() if k.isupper()]
    assert len(keys) >= 3 and len(set(keys)) == len(keys)


def test_database_url_is_required() -> None:
    with pytest.raises(ConfigError, match="EVORA_DATABASE_URL"):
        main.run(load_settings(database_url=None, tokens=TOKENS))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_evora_sweeper_process_stops_gracefully_on_sigterm(
    db_url: str, pool: asyncpg.Pool
) -> None:
    port = _free_port()
    env = os.environ | {
        "EVORA_DATABASE_URL": db_url,
        "EVORA_TOKENS": TOKENS,
        "EVORA_HOST": "127.0.0.1",
        "EVORA_SWEEPER_PORT": str(port),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "evora_services.cli",
        "sweeper",
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:

            async def active() -> bool:
                try:
                    async with session.get("/metrics") as response:
                        return "evora_sweeper_active 1.0" in await response.text()
                except aiohttp.ClientConnectionError:
                    return False

            await until(active, "evora sweeper to start and lead", within=20)
        assert await pool.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        process.send_signal(signal.SIGTERM)
        _, log = await asyncio.wait_for(process.communicate(), timeout=30)
        assert process.returncode == 0, log.decode()
        assert b"sweeper stopped" in log
        assert b"no longer active" in log
        # Unlocked before it disconnected, so no advisory lock outlives the process.
        assert not await pool.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )

        async def disconnected() -> bool:
            sessions: int = await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name LIKE 'evora-sweeper%' AND datname = current_database()"
            )
            return sessions == 0

        await until(disconnected, "its sessions to end")
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
