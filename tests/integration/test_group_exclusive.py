"""A FIFO group runs one job at a time, and a job suspended on a callback still holds its group
(docs/callbacks.md): exclusivity holds against claims whose snapshot predates the group's last
change because the unique index `jobs_group_running` covers RUNNING and SUSPENDED jobs alike
(migration 0063). Before it covered only RUNNING ones, and this race left a group with a
SUSPENDED and a RUNNING job: a claim picks the group's head under its snapshot; meanwhile a new
head is submitted, claimed, and suspended by its worker; the first claim's move to RUNNING then
found the new head's RUNNING index entry dead (its row is SUSPENDED now) and passed.

The race is built at the unlucky moment, not waited for: a gate (tests/gate.py) holds the
first claim after its pick until the new head is suspended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import JobStore
from tests.gate import PAUSED_CLAIMER, gated_pool, held, open_gate, state
from tests.polling import until


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    async with gated_pool(db_url) as pool:
        yield pool


async def test_a_claim_whose_head_was_overtaken_and_suspended_meanwhile_takes_nothing(
    pool: asyncpg.Pool,
) -> None:
    queue = "suspending"
    store = JobStore(pool)
    head = (
        await store.submit(JobSubmission(queue=queue, type="t", group_key="g", priority=1))
    ).job["id"]

    # the claim picks `head` (the group holds nothing, it is the head) and is held
    claim = asyncio.create_task(store.claim(worker_id=PAUSED_CLAIMER, queues=[queue], max_jobs=1))
    await until(lambda: held(pool), "the claim is held")

    # the group gets a new head, claimed by another worker, which suspends it on a callback
    new_head = (
        await store.submit(JobSubmission(queue=queue, type="t", group_key="g", priority=-1))
    ).job["id"]
    [claimed] = await store.claim(worker_id="other", queues=[queue], max_jobs=1)
    assert claimed["id"] == new_head
    await store.suspend(new_head, claimed["lease_token"], timeout_seconds=3600, on_timeout="fail")

    # the held claim goes on: the suspended job holds the group, so it is refused, runs
    # again under a snapshot that shows the group held, and takes nothing
    await open_gate(pool)
    assert await asyncio.wait_for(claim, 30) == []
    assert await state(pool, new_head) == "SUSPENDED"
    assert await state(pool, head) == "PENDING"
    holders = await pool.fetchval(
        "SELECT count(*) FROM evora.jobs WHERE queue = $1 AND group_key = 'g'"
        " AND state IN ('RUNNING', 'SUSPENDED')",
        queue,
    )
    assert holders == 1
