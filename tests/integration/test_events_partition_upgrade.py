"""The upgrade to a partitioned job_events (migration 0032): a database at 0031 with history in
it migrates, keeps every event as it was (seq, xid, content), goes on numbering after the
last seq, and the projector, half-way through that history when the upgrade runs, reads on
without losing or counting twice an event (its checkpoint is by (xid, seq) and the span's
snapshot, which partitioning does not touch)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from pymongo.asynchronous.database import AsyncDatabase

from evora.readmodels.layout import Document
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations, current_version, function_files
from evora_services.projector.projector import Projector
from tests.projector.conftest import catch_up
from tests.projector.test_projection import assert_matches_truth
from tests.projector.workload import mixed_workload

BEFORE = 31
QUEUES = ["alpha", "beta"]
EVENT_ROWS = "SELECT * FROM evora.job_events ORDER BY seq"


@pytest.fixture
async def old_url(pg_server_url: str) -> AsyncIterator[str]:
    """A database of its own at migration 0031, with the function files of today (which
    0032 does not change for what fills it: submissions and transitions)."""
    name = f"m0032_{uuid.uuid4().hex}"
    admin = await asyncpg.connect(pg_server_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        url = urlunsplit(urlsplit(pg_server_url)._replace(path=f"/{name}"))
        await apply_migrations(url, upto=BEFORE)
        conn = await asyncpg.connect(url)
        try:
            for file in function_files():
                if file.name not in ("guards.sql", "retention.sql"):
                    await conn.execute(file.sql)
        finally:
            await conn.close()
        yield url
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def test_history_survives_the_upgrade_and_the_projector_reads_on(
    old_url: str, mongo: AsyncDatabase[Document]
) -> None:
    pool = await create_pool(old_url, min_size=1, max_size=4)
    try:
        store = JobStore(pool)
        async with pool.acquire() as conn:
            assert await current_version(conn) == BEFORE
            assert (
                await conn.fetchval(
                    "SELECT relkind::text FROM pg_class WHERE oid = 'evora.job_events'::regclass"
                )
                == "r"
            )
        await mixed_workload(store, pool, jobs=200, queues=QUEUES, seed=3)
        projector = Projector(pool, mongo, 1, batch_size=50)
        await projector.run_once()  # part of the way, checkpoint recorded
        await mixed_workload(store, pool, jobs=100, queues=QUEUES, seed=4)
        before = [dict(r) for r in await pool.fetch(EVENT_ROWS)]
    finally:
        await pool.close()

    assert await apply_migrations(old_url) == [32]

    pool = await create_pool(old_url, min_size=1, max_size=4)
    try:
        store = JobStore(pool)
        after = [dict(r) for r in await pool.fetch(EVENT_ROWS)]
        assert after == before
        assert (
            await pool.fetchval(
                "SELECT relkind::text FROM pg_class WHERE oid = 'evora.job_events'::regclass"
            )
            == "p"
        )
        # the old table is the first partition; the ones after it are made ahead
        parts = await pool.fetch("SELECT name, upper FROM evora.event_partitions()")
        assert parts[0]["name"] == "job_events_pinitial" and len(parts) >= 4
        assert await pool.fetchval(
            "SELECT max(upper) > evora.clock_now() + interval '2 days'"
            " FROM evora.event_partitions()"
        )
        # new history goes on after the last seq, each event in the partition of its time
        await mixed_workload(store, pool, jobs=100, queues=QUEUES, seed=5)
        newer = await pool.fetch(
            "SELECT e.seq, e.at, p.lower, p.upper FROM evora.job_events e"
            " JOIN pg_class c ON c.oid = e.tableoid"
            " JOIN evora.event_partitions() p ON p.name = c.relname"
            " WHERE e.seq > $1",
            before[-1]["seq"],
        )
        assert newer
        assert all(r["lower"] is None or r["lower"] <= r["at"] < r["upper"] for r in newer)
        # the projector reads on from its checkpoint: every event counted once
        projector = Projector(pool, mongo, 1, batch_size=50)
        await catch_up(projector)
        await assert_matches_truth(pool, mongo)
        # and the table stays append-only
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
            await pool.execute("DELETE FROM evora.job_events WHERE seq = 1")
    finally:
        await pool.close()
