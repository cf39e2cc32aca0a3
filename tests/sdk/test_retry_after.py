"""A handler that raises evora.RetryAfter(seconds, limit_key=...) after an upstream's
rate-limit answer: the worker fails the attempt with `retry_after` (docs/flow-control.md,
"Upstream retry-after"), the key's bucket is drained for every worker, and the job runs again
after it without using up an attempt."""

from __future__ import annotations

import evora
from evora import Client
from evora.storage.jobs import JobStore
from evora.storage.limits import LimitSpec, LimitStore
from tests.polling import until
from tests.sdk.fake import FaultProxy
from tests.sdk.test_worker import in_state, make_worker, serving, stored

KEY = "api:upstream"
THROTTLES = 2
DELAY = 0.3


async def test_a_handler_reports_the_upstreams_retry_after(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    await LimitStore(store._pool).put(KEY, LimitSpec(concurrency=10, rate=None))
    worker = make_worker(proxy)
    runs: list[int] = []

    @worker.handler("call")
    async def call(job: evora.Job) -> str:
        runs.append(job.attempt)
        if len(runs) <= THROTTLES:
            raise evora.RetryAfter(DELAY, limit_key=KEY)
        return "answered"

    job_id = (await client.submit("q", "call", max_attempts=1, limit_keys=[KEY])).id
    async with serving(worker):
        await until(in_state(store, job_id, "COMPLETED"))
    job = await stored(store, job_id)
    # max_attempts=1: neither throttled attempt was counted
    assert (job["attempt"], job["result"]) == (1, "answered")
    assert runs == [1] * (THROTTLES + 1)
    released = [e for e in await store.events(job["id"]) if e["event"] == "released"]
    assert [e["data"]["reason"] for e in released] == ["throttled_upstream"] * THROTTLES
    assert all(e["data"]["error"]["type"] == "RetryAfter" for e in released)
    # the key's bucket was drained, for every worker of the fleet
    assert await store._pool.fetchval(
        "SELECT throttled_until IS NOT NULL FROM evora.flow_buckets WHERE key = $1", KEY
    )
