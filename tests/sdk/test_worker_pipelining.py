"""`evora.Worker` with two claims in flight (`claims_in_flight`, default 2), against the real
api and dispatcher through the proxy of tests/sdk/fake.py: the claims overlap in a drain, the
jobs held never exceed `concurrency`, an idle worker keeps a long-poll waiting while the
other claim returns, and stopping with both long-polls in flight abandons both."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

import evora
from evora import Client, Worker
from evora.storage.jobs import JobStore
from tests.polling import until
from tests.sdk.fake import FaultProxy
from tests.sdk.test_worker import (
    all_in_state,
    carried_batches,
    make_worker,
    outcomes_sent,
    serving,
    stored,
)
from tests.servers import WORKER_TOKEN


class ClaimLedger:
    """Wraps a worker's transport and checks, as each claim is sent, that the jobs it holds
    (handed out by answered claims, outcome not yet sent) plus the jobs asked for by its
    claims in flight, this one included, never exceed its concurrency."""

    def __init__(self, worker: Worker) -> None:
        self.concurrency = worker.settings.concurrency
        self.held = 0
        self.asked: list[int] = []  # max_jobs of each claim in flight
        self.most_in_flight = 0
        self.most_committed = 0
        self._send = worker._http.request
        worker._http.request = self._request  # type: ignore[method-assign]

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        body: Any = kwargs.get("body")
        if path == "/v1/acks":
            self.held -= len(body["acks"])
        if path != "/v1/claim":
            return await self._send(method, path, **kwargs)
        if body.get("acks"):
            self.held -= len(body["acks"])
        max_jobs = body["max_jobs"]
        self.asked.append(max_jobs)
        self.most_in_flight = max(self.most_in_flight, len(self.asked))
        self.most_committed = max(self.most_committed, self.held + sum(self.asked))
        try:
            answer = await self._send(method, path, **kwargs)
        finally:
            self.asked.remove(max_jobs)
        self.held += len(answer.data["jobs"])
        return answer


async def test_a_drain_overlaps_two_claims_without_holding_more_than_concurrency(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    """A backlog of 400 jobs, concurrency 7: two claims of at most 4 are in flight together
    (one is served while the other's jobs run), the jobs held plus those asked for never
    exceed 7, and every outcome is recorded, some carried by claims."""
    worker = make_worker(proxy, concurrency=7)
    ledger = ClaimLedger(worker)
    pace = random.Random(20)

    @worker.handler("t")
    async def handle(job: evora.Job) -> None:
        await asyncio.sleep(pace.choice([0, 0, 0.001, 0.003]))

    ids = [r.id for r in await client.submit_batch([{"queue": "q", "type": "t"}] * 400)]
    async with serving(worker):
        await until(all_in_state(store, ids, "COMPLETED"), "all completed", within=60)
    assert ledger.most_in_flight == 2
    assert ledger.most_committed <= 7
    assert {c.body["max_jobs"] for c in proxy.seen("POST", "/v1/claim")} <= set(range(1, 5))
    assert sorted(a["id"] for a in outcomes_sent(proxy)) == sorted(ids)
    assert carried_batches(proxy)


async def test_an_idle_worker_keeps_a_long_poll_waiting_while_the_other_returns(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    """Both claims long-poll while the worker is idle; the one a job wakes returns and the
    other still waits at the dispatcher, so the next job finds a waiter at once."""
    worker = make_worker(proxy)
    waiting_at_start: list[int] = []
    release = asyncio.Event()

    @worker.handler("t")
    async def handle(job: evora.Job) -> None:
        waiting_at_start.append(proxy.in_flight["/v1/claim"])
        await release.wait()

    async with serving(worker):
        await until(lambda: proxy.in_flight["/v1/claim"] == 2, "two long-polls waiting")
        first = (await client.submit("q", "t")).id
        await until(lambda: len(waiting_at_start) == 1, "the first handler started")
        second = (await client.submit("q", "t")).id
        await until(lambda: len(waiting_at_start) == 2, "the second handler started")
        release.set()
        await until(all_in_state(store, [first, second], "COMPLETED"), "both completed")
    # The first handler starts before its claim is sent again: the other claim still waits.
    assert waiting_at_start[0] == 1


async def test_stop_with_two_long_polls_in_flight_loses_no_job(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    """A worker that ran a batch of jobs waits in two long-polls again; stop() abandons both
    at once (no grace period to wait out), every job it ran is completed, and a job
    submitted afterwards is left for another worker, never claimed."""
    worker = make_worker(proxy, concurrency=8, grace_period=5)

    @worker.handler("t")
    async def handle(job: evora.Job) -> str:
        return job.id

    task = asyncio.create_task(worker.serve())
    await until(lambda: proxy.in_flight["/v1/claim"] == 2, "two long-polls waiting")
    ids = [r.id for r in await client.submit_batch([{"queue": "q", "type": "t"}] * 20)]
    await until(all_in_state(store, ids, "COMPLETED"), "all completed")
    await until(lambda: proxy.in_flight["/v1/claim"] == 2, "two long-polls waiting again")
    loop = asyncio.get_running_loop()
    stop_started = loop.time()
    await asyncio.wait_for(worker.stop(), 10)
    await task
    assert loop.time() - stop_started < 3  # not the grace period: nothing was running
    await until(lambda: proxy.in_flight["/v1/claim"] == 0, "both long-polls abandoned")
    late = (await client.submit("q", "t")).id
    await asyncio.sleep(0.2)
    assert [(await stored(store, i))["result"] for i in ids] == ids
    late_job = await stored(store, late)
    assert late_job["state"] == "PENDING" and late_job["attempt"] == 0


def test_claims_in_flight_is_checked_and_kept_by_reconfigured() -> None:
    with pytest.raises(ValueError, match="claims_in_flight"):
        Worker("http://127.0.0.1:1", WORKER_TOKEN, ["q"], claims_in_flight=0)
    worker = Worker("http://127.0.0.1:1", WORKER_TOKEN, ["q"], claims_in_flight=1)
    assert worker.reconfigured(concurrency=3).settings.claims_in_flight == 1
