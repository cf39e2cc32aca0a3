"""A gate that holds a statement at the unlucky moment: a test trigger stops it at a row it
changes (the row already locked: a BEFORE row trigger of an UPDATE or DELETE runs after the
lock) until the test opens the gate, while the test lets others act. The race tests of claims
(tests/integration/test_claim_lock_waits.py, test_group_exclusive.py) and of lock order
(test_lock_order.py) build their cycles with it. A sleep loop, not a lock wait: the pause is
no lock, and no lock timeout of the held statement ends it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from uuid import UUID

import asyncpg

from evora.storage.db import create_pool

GATE_SQL = """
CREATE TABLE lock_gate (open boolean NOT NULL);
INSERT INTO lock_gate VALUES (false);
CREATE FUNCTION hold_at_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WHILE NOT (SELECT open FROM lock_gate) LOOP
        PERFORM pg_sleep(0.01);
    END LOOP;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END $$;
"""

GATED_TABLES = ("evora.jobs", "evora.flow_buckets")

# The worker id whose claims `hold_claims` holds.
PAUSED_CLAIMER = "paused-claimer"


@asynccontextmanager
async def gate_on(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Pool]:
    """The gate, closed, in the database of `pool`, holding nothing until `hold` says what;
    its triggers dropped after."""
    await pool.execute(GATE_SQL)
    try:
        yield pool
    finally:
        for table in GATED_TABLES:
            await pool.execute(f"DROP TRIGGER IF EXISTS hold_at_gate ON {table}")


async def hold(pool: asyncpg.Pool, table: str, event: str, held_when: str) -> None:
    """Holds each `event` (UPDATE, DELETE) of a row of `table` that matches `held_when` (a
    condition on OLD and NEW) at the gate, the row locked."""
    assert table in GATED_TABLES
    await pool.execute(
        f"CREATE TRIGGER hold_at_gate BEFORE {event} ON {table} FOR EACH ROW"
        f" WHEN ({held_when}) EXECUTE FUNCTION hold_at_gate()"
    )


@asynccontextmanager
async def gated_pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool of four on the database at `db_url`, the claims of PAUSED_CLAIMER held at the
    gate (closed) inside evora.claim_jobs()'s move to RUNNING, after their pick chose and
    locked their jobs under its snapshot."""
    pool = await create_pool(db_url, min_size=4, max_size=4)
    try:
        async with gate_on(pool):
            await hold(
                pool,
                "evora.jobs",
                "UPDATE",
                f"NEW.worker_id = '{PAUSED_CLAIMER}' AND OLD.state = 'PENDING'",
            )
            yield pool
    finally:
        await pool.close()


async def open_gate(pool: asyncpg.Pool) -> None:
    await pool.execute("UPDATE lock_gate SET open = true")


async def held(pool: asyncpg.Pool) -> bool:
    """Whether a statement waits at the gate."""
    return await waiting(pool, "Timeout", "PgSleep")


async def waiting(pool: asyncpg.Pool, event_type: str, event: str | None = None) -> bool:
    """Whether a session of the database waits for an event of `event_type` (`event`)."""
    return bool(
        await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = $1 AND ($2::text IS NULL OR wait_event = $2)",
            event_type,
            event,
        )
    )


async def state(pool: asyncpg.Pool, job_id: UUID) -> str:
    job_state: str = await pool.fetchval("SELECT state::text FROM evora.jobs WHERE id = $1", job_id)
    return job_state
