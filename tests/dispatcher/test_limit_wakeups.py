"""A worker long-polling a queue whose jobs a limit holds back is woken by the limit's change
(raised or deleted) through NOTIFY, not left to the fallback poll."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import JobStore
from evora.storage.limits import LimitSpec, LimitStore
from tests.dispatcher.conftest import Dispatcher

Q = "throttled"
KEY = "api:x"


@pytest.mark.parametrize("change", ["raise", "delete"])
async def test_a_limit_change_wakes_a_poll_waiting_on_the_jobs_it_held_back(
    dispatcher: Dispatcher, pool: asyncpg.Pool, store: JobStore, change: str
) -> None:
    limits = LimitStore(pool)
    await limits.put(KEY, LimitSpec(concurrency=1, rate=None))
    for _ in range(2):
        await store.submit(JobSubmission(queue=Q, type="t", limit_keys=[KEY]))
    [running] = await store.claim(worker_id="busy", queues=[Q])
    empty_claims = dispatcher.empty_claims()
    poll = asyncio.create_task(
        dispatcher.post("/v1/claim", {"worker_id": "w", "queues": [Q], "wait_seconds": 30})
    )
    # the poll found the other job held back and waits
    await dispatcher.poll_waiting(Q, empty_claims)
    notified = dispatcher.metric("evora_dispatcher_wakeups_total", cause="notify")

    if change == "raise":
        await limits.put(KEY, LimitSpec(concurrency=2, rate=None))
    else:
        await limits.delete(KEY)
    status, answer = await asyncio.wait_for(poll, 20)

    assert status == 200 and len(answer["jobs"]) == 1
    assert answer["jobs"][0]["id"] != str(running["id"])
    # woken by the change's hint (the fallback poll would count as cause="poll")
    assert dispatcher.metric("evora_dispatcher_wakeups_total", cause="notify") > notified
