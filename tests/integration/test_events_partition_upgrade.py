"""The upgrade to a partitioned job_events (migration 0032): a database at 0031 with history in
it migrates, keeps every event as it was (seq, xid, content), goes on numbering after the
last seq, and the projector, half-way through that history when new events come, reads on
without losing or counting twice an event (its checkpoint is by (xid, seq) and the span's
snapshot, which partitioning does not touch). This release's projector reads the outbox's
tables of migration 0064 (the statement batches beside the rows), so it starts after the
upgrade, on the history written before it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import asyncpg
import pytest
from pymongo.asynchronous.database import AsyncDatabase

from evora.readmodels.layout import Document
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations, current_version
from evora_services.projector.projector import Projector
from tests.projector.conftest import catch_up
from tests.projector.test_projection import assert_matches_truth
from tests.projector.workload import mixed_workload

BEFORE = 31
REPO = Path(__file__).resolve().parents[2]
# main with migration 0031 its newest: its function files are what a database at 0031 runs.
BEFORE_PARTITIONS = "f21e66e"
QUEUES = ["alpha", "beta"]
FILES = "shared/evora/storage/functions"
EVENT_ROWS = "SELECT * FROM evora.job_events ORDER BY seq"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout


def old_function_files() -> list[str]:
    """The function files of BEFORE_PARTITIONS, in the order migrate runs them (by name)."""
    names = _git("ls-tree", "--name-only", f"{BEFORE_PARTITIONS}:{FILES}").split()
    return [
        _git("show", f"{BEFORE_PARTITIONS}:{FILES}/{n}")
        for n in sorted(names)
        if n.endswith(".sql")
    ]


async def submit_in_sql(pool: asyncpg.Pool, batches: int) -> None:
    """`batches` transactions of 50 jobs each, half in each queue, by `evora.submit_batch`."""
    for n in range(batches):
        jobs = [{"queue": QUEUES[i % 2], "type": f"t{n}"} for i in range(50)]
        await pool.execute("SELECT evora.submit_batch($1::jsonb)", jobs)


@pytest.fixture
async def old_url(empty_db_url: str) -> str:
    """A database of its own at migration 0031, with the function files of that release
    (`git show` from BEFORE_PARTITIONS)."""
    await apply_migrations(empty_db_url, upto=BEFORE)
    conn = await asyncpg.connect(empty_db_url)
    try:
        for text in old_function_files():
            await conn.execute(text)
    finally:
        await conn.close()
    return empty_db_url


async def test_history_survives_the_upgrade_and_the_projector_reads_on(
    old_url: str,
    mongo: AsyncDatabase[Document],
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
        # through that release's SQL: today's JobStore reads columns later migrations add
        await submit_in_sql(pool, 6)
        before = [dict(r) for r in await pool.fetch(EVENT_ROWS)]
    finally:
        await pool.close()

    assert (await apply_migrations(old_url))[0] == 32

    pool = await create_pool(old_url, min_size=1, max_size=4)
    try:
        store = JobStore(pool)
        projector = Projector(pool, mongo, 1, batch_size=50)
        await projector.run_once()  # part of the way, checkpoint recorded
        after = [dict(r) for r in await pool.fetch(EVENT_ROWS)]
        assert after == before
        assert (
            await pool.fetchval(
                "SELECT relkind::text FROM pg_class WHERE oid = 'evora.job_event_rows'::regclass"
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
        # (the outbox's two tables, migration 0064: rows, and a statement's batches)
        newer = await pool.fetch(
            "SELECT e.at, p.lower, p.upper"
            " FROM (SELECT seq AS last, at, tableoid FROM evora.job_event_rows"
            "       UNION ALL SELECT last_seq, at, tableoid FROM evora.event_batches) e"
            " JOIN pg_class c ON c.oid = e.tableoid"
            " JOIN evora.event_tables() p ON p.name = c.relname"
            " WHERE e.last > $1",
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
