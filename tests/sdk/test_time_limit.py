"""A job with `max_duration_seconds` under a real worker (docs/jobs-that-wait.md, "A hard
time limit"): past the limit a heartbeat answers `timeout_requested`, the worker sets the
handler's `cancel_event` and `timeout_requested`; a handler that stops is failed by the
worker with error type `timeout` (not handed back, which would not count the attempt), and
one that ignores it is failed by the sweeper once the grace (lease_seconds) has passed."""

from __future__ import annotations

import asyncio

import evora
from evora import Client
from evora.storage.jobs import JobStore
from evora.storage.rows import JobDict
from tests.polling import until
from tests.sdk.fake import FaultProxy
from tests.sdk.test_worker import in_state, make_worker, serving, stored

LIMIT = 1
LEASE = 2


async def test_a_cooperative_handler_stops_and_the_attempt_fails_with_timeout(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    worker = make_worker(proxy, cancel_grace=30)
    seen: list[tuple[int | None, bool]] = []

    @worker.handler("t")
    async def cooperative(job: evora.Job) -> None:
        await job.cancel_event.wait()
        seen.append((job.max_duration_seconds, job.timeout_requested))
        job.raise_if_cancel_requested()

    job_id = (
        await client.submit(
            "q", "t", max_duration_seconds=LIMIT, lease_seconds=LEASE, max_attempts=1
        )
    ).id
    async with serving(worker):
        await until(in_state(store, job_id, "DLQ"))
    assert seen == [(LIMIT, True)]
    job = await stored(store, job_id)
    assert (job["attempt"], job["last_error"]["type"]) == (1, "timeout")
    # failed by the worker, not handed back
    assert not proxy.seen("POST", "/v1/jobs/{id}/release")
    events = await store.events(job["id"])
    assert [e["event"] for e in events] == ["submitted", "claimed", "dead_lettered"]


async def test_a_handler_ignoring_the_timeout_is_failed_by_the_sweeper_after_the_grace(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    # the worker would wait long for the handler to stop: the sweeper ends it first
    worker = make_worker(proxy, cancel_grace=60)
    running: list[evora.Job] = []
    given_up = asyncio.Event()

    @worker.handler("t")
    async def stubborn(job: evora.Job) -> None:
        running.append(job)
        try:
            await asyncio.Event().wait()  # never looks at cancel_event
        except asyncio.CancelledError:
            given_up.set()
            raise

    job_id = (
        await client.submit(
            "q", "t", max_duration_seconds=LIMIT, lease_seconds=LEASE, max_attempts=1
        )
    ).id
    async with serving(worker):
        await until(lambda: bool(running) and running[0].timeout_requested, "timeout_requested")
        assert running[0].cancel_event.is_set() and not given_up.is_set()
        [timed_out] = await _swept(store)
        assert str(timed_out["id"]) == job_id and timed_out["state"] == "DLQ"
        # the next heartbeat finds the lease gone, and the worker abandons the handler
        await asyncio.wait_for(given_up.wait(), 10)
    job = await stored(store, job_id)
    assert (job["attempt"], job["last_error"]["type"]) == (1, "timeout")
    [*_, last] = await store.events(job["id"])
    assert (last["event"], last["data"]["reason"]) == ("dead_lettered", "timeout")
    assert not proxy.seen("POST", "/v1/acks") and not proxy.seen("POST", "/v1/jobs/{id}/release")


async def _swept(store: JobStore) -> list[JobDict]:
    """The sweeper's time_out pass, run until it times an attempt out (the grace ends)."""
    jobs: list[JobDict] = []

    async def timed_out() -> bool:
        jobs.extend(await store.time_out())
        return bool(jobs)

    await until(timed_out, "the sweeper's time_out pass takes the job", within=15)
    return jobs


async def test_a_job_claimed_ahead_past_its_limit_never_runs_and_fails_with_timeout(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    """The attempt's time runs from its claim, waiting for a slot included: one claimed ahead
    (`prefetch`) that is past its limit before it starts is failed, not handed back."""
    worker = make_worker(proxy, concurrency=1, prefetch=1)
    finish = asyncio.Event()
    started: list[str] = []

    @worker.handler("t")
    async def handle(job: evora.Job) -> None:
        started.append(job.id)
        await finish.wait()

    blocker = (await client.submit("q", "t", lease_seconds=30)).id
    late = (
        await client.submit(
            "q", "t", max_duration_seconds=LIMIT, lease_seconds=LEASE, max_attempts=1
        )
    ).id
    async with serving(worker):
        await until(in_state(store, late, "DLQ"))
        finish.set()
        await until(in_state(store, blocker, "COMPLETED"))
    assert started == [blocker]
    assert (await stored(store, late))["last_error"]["type"] == "timeout"
    assert not proxy.seen("POST", "/v1/jobs/{id}/release")
