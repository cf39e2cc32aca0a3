"""A gate that holds a claim at the unlucky moment: inside evora.claim_jobs()'s move to
RUNNING, after its pick chose and locked its jobs under its snapshot, until the test opens it.
The tests that build a race between claims (tests/integration/test_claim_lock_waits.py,
test_group_exclusive.py) let others act meanwhile, then open the gate."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from uuid import UUID

import asyncpg

from evora.storage.db import create_pool

PAUSED_CLAIMER = "paused-claimer"

# Holds the first claim by PAUSED_CLAIMER inside its move to RUNNING (after it picked and
# locked its jobs) until the test opens the gate. A sleep loop, not a lock wait: the claim's
# own lock timeout must not end the pause.
PAUSE_SQL = f"""
CREATE TABLE claim_gate (open boolean NOT NULL);
INSERT INTO claim_gate VALUES (false);
CREATE FUNCTION hold_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WHILE NOT (SELECT open FROM claim_gate) LOOP
        PERFORM pg_sleep(0.01);
    END LOOP;
    RETURN NEW;
END $$;
CREATE TRIGGER hold_claim BEFORE UPDATE ON evora.jobs FOR EACH ROW
    WHEN (NEW.worker_id = '{PAUSED_CLAIMER}' AND OLD.state = 'PENDING')
    EXECUTE FUNCTION hold_claim();
"""


@asynccontextmanager
async def gated_pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool of four on the database at `db_url`, its claims by PAUSED_CLAIMER held at the
    gate (closed) while the pool is open."""
    pool = await create_pool(db_url, min_size=4, max_size=4)
    try:
        await pool.execute(PAUSE_SQL)
        yield pool
    finally:
        await pool.execute("DROP TRIGGER IF EXISTS hold_claim ON evora.jobs")
        await pool.close()


async def open_gate(pool: asyncpg.Pool) -> None:
    await pool.execute("UPDATE claim_gate SET open = true")


async def claim_held(pool: asyncpg.Pool) -> bool:
    """Whether the claim waits at the gate."""
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
