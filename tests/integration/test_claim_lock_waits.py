"""A claim is the one party of a lock cycle that gives way.

A claim never waits for a row (it skips what is locked), but moving a grouped job to RUNNING
checks `jobs_group_running`, one RUNNING job per group, and that check waits for any
transaction still moving a RUNNING job of the group, in or out. Meanwhile the claim holds the
rows it picked, and the rows its `SKIP LOCKED` pick found updated after its snapshot and
locked to recheck (PostgreSQL keeps those locks though the rows are not taken). A completion,
a cancel or a heartbeat that needs one of those rows, in a transaction that moves the group's
RUNNING job, closes a cycle, and PostgreSQL's deadlock detector then fails whichever party
looks first: seen in CI as a worker's completion failing with a deadlock. A claim changes
nothing until it commits and is simply run again, so it is the claim that must give way: it
waits for a lock at most a short time (evora.claim_jobs(), well under deadlock_timeout), and
the store runs it again.

The cycle is built at the unlucky moment, not waited for: a test trigger holds the claim
after it picked its jobs, a held transaction claims the group's new head and then cancels a
job the paused claim holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from uuid import UUID

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.limits import LimitSpec, LimitStore
from tests.polling import until

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


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(db_url, min_size=4, max_size=4)
    try:
        await pool.execute(PAUSE_SQL)
        yield pool
    finally:
        await pool.execute("DROP TRIGGER IF EXISTS hold_claim ON evora.jobs")
        await pool.close()


async def _waiting(pool: asyncpg.Pool, event_type: str, event: str | None = None) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = $1 AND ($2::text IS NULL OR wait_event = $2)",
            event_type,
            event,
        )
    )


async def _state(pool: asyncpg.Pool, job_id: UUID) -> str:
    state: str = await pool.fetchval("SELECT state::text FROM evora.jobs WHERE id = $1", job_id)
    return state


# While any concurrency or rate limit exists, every claim is evora.claim_limited(), which
# moves its jobs with the same function. (A fair queue's claims take turns, so two of them
# never race for a group.)
@pytest.mark.parametrize("claim", ["plain", "limited"])
async def test_a_claim_in_a_lock_cycle_gives_way_and_the_cancel_goes_on(
    pool: asyncpg.Pool, claim: str
) -> None:
    queue = "cycle"
    store = JobStore(pool)
    if claim == "limited":
        await LimitStore(pool).put("elsewhere", LimitSpec(concurrency=10, rate=None))
    plain = (await store.submit(JobSubmission(queue=queue, type="t", priority=0))).job["id"]
    grouped = (
        await store.submit(JobSubmission(queue=queue, type="t", group_key="g", priority=1))
    ).job["id"]

    # the claim picks both (the group runs nothing, `grouped` is its head) and is held
    paused = asyncio.create_task(store.claim(worker_id=PAUSED_CLAIMER, queues=[queue], max_jobs=2))
    await until(lambda: _waiting(pool, "Timeout", "PgSleep"), "the claim is held")

    # the group gets a new head, and a held transaction claims it: the group's RUNNING job is
    # that transaction's, uncommitted; then it cancels the job the held claim locked
    new_head = (
        await store.submit(JobSubmission(queue=queue, type="t", group_key="g", priority=-1))
    ).job["id"]
    async with pool.acquire() as holder:
        transaction = holder.transaction()
        await transaction.start()
        claimed = await holder.fetch(queries.CLAIM, [queue], None, 1, "holder")
        assert [r["job"]["id"] for r in claimed] == [new_head]
        cancel = asyncio.create_task(holder.fetch(queries.CANCEL, plain, []))
        await until(lambda: _waiting(pool, "Lock"), "the cancel waits for the held claim")

        # the claim goes on: its move of `grouped` waits for the holder, which waits for it
        await pool.execute("UPDATE claim_gate SET open = true")
        [row] = await asyncio.wait_for(cancel, 30)
        assert row["outcome"] == "done"  # not a deadlock: the claim gave way
        await transaction.commit()

    assert await asyncio.wait_for(paused, 30) == []  # run again: nothing left for it
    assert await _state(pool, plain) == "CANCELLED"
    assert await _state(pool, new_head) == "RUNNING"
    assert await _state(pool, grouped) == "PENDING"
