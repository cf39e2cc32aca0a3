"""A claim is the one party of a lock cycle that gives way.

A claim never waits for a row (it skips what is locked), but moving a grouped job to RUNNING
checks `jobs_group_running`, one RUNNING or SUSPENDED job per group, and that check waits for
any transaction still changing a RUNNING or SUSPENDED job of the group. Meanwhile the claim
holds the rows it picked, and the rows its `SKIP LOCKED` pick found updated after its snapshot
and locked to recheck (PostgreSQL keeps those locks though the rows are not taken). A completion,
a cancel or a heartbeat that needs one of those rows, in a transaction that moves the group's
RUNNING job, closes a cycle, and PostgreSQL's deadlock detector then fails whichever party
looks first: seen in CI as a worker's completion failing with a deadlock. A claim changes
nothing until it commits and is simply run again, so it is the claim that must give way: it
waits for a lock at most a short time (evora.claim_jobs(), well under deadlock_timeout), and
the store runs it again.

The cycle is built at the unlucky moment, not waited for: a gate (tests/gate.py) holds
the claim after it picked its jobs, a held transaction claims the group's new head and then
cancels a job the paused claim holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.jobs import JobStore
from evora.storage.limits import LimitSpec, LimitStore
from tests.gate import PAUSED_CLAIMER, gated_pool, held, open_gate, state
from tests.polling import until, waits_for_a_lock


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    async with gated_pool(db_url) as pool:
        yield pool


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
    await until(lambda: held(pool), "the claim is held")

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
        await waits_for_a_lock(pool)  # the cancel, for the held claim

        # the claim goes on: its move of `grouped` waits for the holder, which waits for it
        await open_gate(pool)
        [row] = await asyncio.wait_for(cancel, 30)
        assert row["outcome"] == "done"  # not a deadlock: the claim gave way
        await transaction.commit()

    # Run again, the claim never takes `grouped`: its group runs `new_head`. Whether it takes
    # `plain` is a race between its next pick and the cancel it let go: before the cancel
    # locks `plain`, the claim takes it and the cancel becomes a request to its worker.
    again = await asyncio.wait_for(paused, 30)
    assert [job["id"] for job in again] in ([], [plain])
    assert await state(pool, plain) == ("RUNNING" if again else "CANCELLED")
    if again:
        assert await pool.fetchval("SELECT cancel_requested FROM evora.jobs WHERE id = $1", plain)
    assert await state(pool, new_head) == "RUNNING"
    assert await state(pool, grouped) == "PENDING"
