"""`evora.Worker` against the real api and dispatcher, through the proxy of tests/sdk/fake.py
where a test watches what the worker sends or stages a failure."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import logging
import os
import signal
import sys
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

import evora
from evora import Client, Worker
from evora.collector import GC_YOUNG_THRESHOLD
from evora.logs import context as log_fields
from evora.sdk.client import BackoffSpec, Submission
from evora.storage.jobs import JobStore
from evora.storage.rows import JobDict
from examples.worker_example import handlers as example_handlers
from tests.conftest import Clock
from tests.polling import Condition, until
from tests.sdk.conftest import FAST
from tests.sdk.fake import FaultProxy, Seen
from tests.servers import WORKER_TOKEN, Services

REPO = Path(__file__).resolve().parents[2]
# Jobs whose lease a test takes away are not claimed again while it runs.
AN_HOUR: BackoffSpec = {"initial_seconds": 3600, "max_seconds": 3600}


def make_worker(proxy: FaultProxy, **kwargs: Any) -> Worker:
    settings: dict[str, Any] = {
        "queues": ["q"],
        "concurrency": 4,
        "wait_seconds": 30,
        "grace_period": 5,
        "backoff": FAST,
        **kwargs,
    }
    return Worker(proxy.url, WORKER_TOKEN, **settings)


@asynccontextmanager
async def serving(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(worker.serve())
    try:
        yield task
    finally:
        await asyncio.wait_for(worker.stop(), 10)
        await task


async def stored(store: JobStore, job_id: str) -> JobDict:
    return await store.get(UUID(job_id))


def in_state(store: JobStore, job_id: str, state: str) -> Condition:
    async def reached() -> bool:
        return bool((await stored(store, job_id))["state"] == state)

    return reached


async def failed(store: JobStore, job_id: str) -> bool:
    return (await stored(store, job_id))["last_error"] is not None


def all_in_state(store: JobStore, ids: list[str], state: str) -> Condition:
    # One statement, not a read per job: polling a backlog of hundreds job by job took most
    # of a loaded machine's time from the drain it waited for.
    uuids = [UUID(i) for i in ids]

    async def reached() -> bool:
        count = await store.pool.fetchval(
            "SELECT count(*) FROM evora.jobs WHERE id = ANY($1::uuid[]) AND state::text = $2",
            uuids,
            state,
        )
        return bool(count == len(uuids))

    return reached


async def take_lease_away(clock: Clock, store: JobStore, job_id: str) -> None:
    """What the sweeper does when a lease runs out: the job goes back to PENDING (for a
    backoff of AN_HOUR), its token void."""
    await clock.advance((await stored(store, job_id))["lease_seconds"] + 1)
    assert [j["id"] for j in await store.expire_leases()] == [UUID(job_id)]


async def test_claims_runs_and_completes_with_the_return_value(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    worker = make_worker(proxy, handlers=example_handlers)
    job_id = (await client.submit("q", "demo.echo", {"hello": ["world"]})).id
    async with serving(worker):
        await until(in_state(store, job_id, "COMPLETED"))
    assert (await client.get(job_id))["result"] == {"hello": ["world"]}
    claim = proxy.seen("POST", "/v1/claim")[0].body
    assert claim["worker_id"] == worker.settings.worker_id and claim["queues"] == ["q"]
    assert claim["types"] == example_handlers.types and claim["max_jobs"] == 4


async def test_the_example_def_handler_runs_in_a_thread_and_completes(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    payload = {"rounds": 3}
    job_id = (await client.submit("q", "demo.hash", payload)).id
    async with serving(make_worker(proxy, handlers=example_handlers)):
        await until(in_state(store, job_id, "COMPLETED"))
    digest = repr(payload).encode()
    for _ in range(3):
        digest = hashlib.sha256(digest).digest()
    assert (await client.get(job_id))["result"] == {"sha256": digest.hex()}


async def test_failures_are_reported_retryable_unless_the_exception_says_not(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    flaky = (await client.submit("q", "demo.fail")).id
    fatal = (await client.submit("q", "demo.fatal", {"x": 1})).id
    async with serving(make_worker(proxy, handlers=example_handlers)):

        async def reported() -> bool:
            retrying, dead = await stored(store, flaky), await stored(store, fatal)
            return bool(
                retrying["attempt"] == 1
                and retrying["state"] == "PENDING"
                and (dead["state"] == "DLQ")
            )

        await until(reported, "both outcomes recorded")
    errors = {
        item["id"]: item["error"]
        for batch in proxy.seen("POST", "/v1/acks")
        for item in batch.body["acks"]
    }
    # the stack trace ends where the handler raised
    assert (
        errors[flaky]
        .pop("traceback")
        .endswith("FlakyServiceError: attempt 1 of 5 failed (on purpose)\n")
    )
    assert errors[flaky] == {
        "message": "attempt 1 of 5 failed (on purpose)",
        "type": "FlakyServiceError",
        "retryable": True,
    }
    assert errors[fatal]["retryable"] is False and errors[fatal]["type"] == "NonRetryable"


async def test_a_result_that_is_not_json_fails_for_good(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    worker = make_worker(proxy)

    @worker.handler("t")
    async def handle(job: evora.Job) -> object:
        return object()

    job_id = (await client.submit("q", "t")).id
    async with serving(worker):
        await until(in_state(store, job_id, "DLQ"))
    error = (await stored(store, job_id))["last_error"]
    assert error["type"] == "TypeError" and "not JSON-serialisable" in error["message"]


async def test_heartbeats_keep_the_lease_and_carry_progress(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    worker = make_worker(proxy)

    def heartbeats() -> list[Seen]:
        return proxy.seen("POST", "/v1/jobs/{id}/heartbeat")

    @worker.handler("t")
    async def handle(job: evora.Job) -> str:
        job.progress({"step": 1})
        await until(lambda: len(heartbeats()) >= 2, "two heartbeats")
        return "done"

    job_id = (await client.submit("q", "t", lease_seconds=1)).id  # a heartbeat every 1/3 s
    async with serving(worker):
        await until(in_state(store, job_id, "COMPLETED"))
    first, second = (h.body for h in heartbeats()[:2])
    assert first["progress"] == {"step": 1} and "progress" not in second
    assert first["lease_token"] == second["lease_token"]


async def test_the_jobs_of_a_claim_share_one_timer_until_their_first_heartbeat(
    proxy: FaultProxy, client: Client, store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim of ten jobs with one lease length arms one timer, not ten. The jobs that end
    before it fires get no heartbeat; the one still running gets its heartbeats from then."""
    worker = make_worker(proxy, concurrency=10)
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_later = loop.call_later

    def counting(delay: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        armed.append(delay)
        return call_later(delay, callback, *args, **kwargs)

    def heartbeats() -> list[Seen]:
        return proxy.seen("POST", "/v1/jobs/{id}/heartbeat")

    @worker.handler("t")
    async def handle(job: evora.Job) -> None:
        if job.payload["long"]:
            await until(lambda: len(heartbeats()) >= 2, "two heartbeats")

    submitted: list[Submission] = [
        {"queue": "q", "type": "t", "payload": {"long": n == 0}, "lease_seconds": 1}
        for n in range(10)
    ]
    ids = [r.id for r in await client.submit_batch(submitted)]
    monkeypatch.setattr(loop, "call_later", counting)
    async with serving(worker):
        await until(all_in_state(store, ids, "COMPLETED"), "all completed")
    assert proxy.seen("POST", "/v1/claim")[0].body["max_jobs"] == 10
    # a heartbeat every 1/3 s: one timer for the whole claim
    assert armed.count(1 / 3) == 1
    assert {h.path for h in heartbeats()} == {f"/v1/jobs/{ids[0]}/heartbeat"}


async def test_a_failed_heartbeat_is_retried_sooner_with_its_progress(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    proxy.fault("POST", "/v1/jobs/{id}/heartbeat", 503)
    worker = make_worker(proxy)
    loop = asyncio.get_running_loop()

    def heartbeats() -> list[Seen]:
        return proxy.seen("POST", "/v1/jobs/{id}/heartbeat")

    @worker.handler("t")
    async def handle(job: evora.Job) -> float:
        job.progress({"step": 1})
        await until(lambda: len(heartbeats()) >= 1, "a heartbeat")
        failed_at = loop.time()
        await until(lambda: len(heartbeats()) >= 2, "a second heartbeat")
        return loop.time() - failed_at

    # A heartbeat every 2/3 s; after a transient failure, the next one 1/6 s later.
    job_id = (await client.submit("q", "t", lease_seconds=2)).id
    async with serving(worker):
        await until(in_state(store, job_id, "COMPLETED"))
    failed, retried = (h.body for h in heartbeats()[:2])
    assert failed["progress"] == retried["progress"] == {"step": 1}
    assert (await stored(store, job_id))["result"] < 0.5


async def test_heartbeats_go_on_until_the_outcome_is_recorded(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    for _ in range(2):
        proxy.fault("POST", "/v1/acks", 503, delay=0.5)
    worker = make_worker(proxy, handlers=example_handlers)
    job_id = (await client.submit("q", "demo.echo", lease_seconds=1)).id
    async with serving(worker):
        await until(in_state(store, job_id, "COMPLETED"))
    # The handler returned at once, the outcome was recorded a second later.
    assert proxy.seen("POST", "/v1/jobs/{id}/heartbeat")


@pytest.mark.parametrize("kind", ["async def", "def"])
async def test_log_records_of_a_job_say_which_job(
    proxy: FaultProxy, client: Client, store: JobStore, kind: str
) -> None:
    class Fields(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.by_message: dict[str, dict[str, Any]] = {}

        def emit(self, record: logging.LogRecord) -> None:
            self.by_message[record.getMessage()] = dict(log_fields())

    worker = make_worker(proxy)

    def handle(job: evora.Job) -> None:
        logging.getLogger("tests.handler").warning("handling %s", job.id)
        raise RuntimeError("broken")

    async def handle_async(job: evora.Job) -> None:
        handle(job)

    # A `def` handler logs from its thread: the job's fields go there with it.
    worker.handler("t")(handle_async if kind == "async def" else handle)
    fields = Fields()
    root = logging.getLogger()
    root.addHandler(fields)
    try:
        job_id = (await client.submit("q", "t")).id
        async with serving(worker):
            await until(lambda: failed(store, job_id), "the failure recorded")
    finally:
        root.removeHandler(fields)
    expected = {"job_id": job_id, "queue": "q", "job_type": "t"}
    assert fields.by_message[f"handling {job_id}"] == expected
    assert fields.by_message[f"job {job_id} (t, attempt 1 of 5) failed: broken"] == expected


async def test_a_cooperative_handler_stops_on_cancel_and_the_job_is_cancelled(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    worker = make_worker(proxy, handlers=example_handlers, cancel_grace=10)
    job_id = (await client.submit("q", "demo.sleep", {"seconds": 60}, lease_seconds=1)).id
    async with serving(worker):
        await until(in_state(store, job_id, "RUNNING"))
        assert (await client.cancel(job_id))["cancel_requested"]
        await until(in_state(store, job_id, "CANCELLED"))
    assert len(proxy.seen("POST", "/v1/jobs/{id}/release")) == 1
    assert not proxy.seen("POST", "/v1/acks")


async def test_a_handler_ignoring_cancel_is_cancelled_after_the_cancel_grace(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    worker = make_worker(proxy, cancel_grace=0.1)
    cancelled = asyncio.Event()

    @worker.handler("t")
    async def stubborn(job: evora.Job) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job_id = (await client.submit("q", "t", lease_seconds=1)).id
    async with serving(worker):
        await until(in_state(store, job_id, "RUNNING"))
        await client.cancel(job_id)
        await until(in_state(store, job_id, "CANCELLED"))
    assert cancelled.is_set()
    # the cancel ended the job: the attempt ran, so it counts
    assert (await stored(store, job_id))["attempt"] == 1


async def test_a_lost_lease_seen_by_a_heartbeat_abandons_the_handler(
    proxy: FaultProxy, client: Client, store: JobStore, clock: Clock
) -> None:
    worker = make_worker(proxy)
    cancelled = asyncio.Event()

    @worker.handler("t")
    async def handle(job: evora.Job) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job_id = (await client.submit("q", "t", lease_seconds=1, backoff=AN_HOUR)).id
    async with serving(worker):
        await until(in_state(store, job_id, "RUNNING"))
        await take_lease_away(clock, store, job_id)
        await asyncio.wait_for(cancelled.wait(), 5)
    assert not proxy.seen("POST", "/v1/acks") and not proxy.seen("POST", "/v1/jobs/{id}/release")


async def test_an_outcome_for_a_lost_lease_is_logged_as_taken_away(
    proxy: FaultProxy,
    client: Client,
    store: JobStore,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = make_worker(proxy)
    gate = asyncio.Event()

    @worker.handler("t")
    async def handle(job: evora.Job) -> str:
        await gate.wait()
        return "too late"

    job_id = (await client.submit("q", "t", backoff=AN_HOUR)).id
    with caplog.at_level(logging.WARNING, logger="evora.worker"):
        async with serving(worker):
            await until(in_state(store, job_id, "RUNNING"))
            await take_lease_away(clock, store, job_id)
            gate.set()
            await until(lambda: bool(proxy.seen("POST", "/v1/acks")), "the outcome sent")
    late = await stored(store, job_id)
    assert late["state"] == "PENDING" and late["result"] is None
    assert "taken away" in caplog.text


def carried_batches(proxy: FaultProxy) -> list[list[dict[str, Any]]]:
    """The outcomes each claim carried (its `acks`), claims without any left out."""
    return [c.body["acks"] for c in proxy.seen("POST", "/v1/claim") if c.body.get("acks")]


def _claimed_after_carrying(proxy: FaultProxy) -> Callable[[], bool]:
    def claimed() -> bool:
        claims = proxy.seen("POST", "/v1/claim")
        carrying = [n for n, claim in enumerate(claims) if claim.body.get("acks")]
        return not carrying or len(claims) > carrying[-1] + 1

    return claimed


async def test_outcomes_are_batched_under_load(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    """All slots busy: the first batch rides in the claim waiting for their slots (one
    request, not two), later ones (a claim long-polling by then) go by /v1/acks."""
    worker = make_worker(proxy, concurrency=20)
    gate = asyncio.Event()

    @worker.handler("t")
    async def handle(job: evora.Job) -> int:
        await gate.wait()
        return int(job.payload["n"])

    ids = [(await client.submit("q", "t", {"n": n})).id for n in range(20)]
    async with serving(worker):
        await until(all_in_state(store, ids, "RUNNING"), "all running")
        gate.set()
        await until(all_in_state(store, ids, "COMPLETED"), "all completed")
        # The jobs are COMPLETED once the carrying claim's statement commits, which may be
        # before the worker has read that claim's answer; stopped before, it would send the
        # outcomes again (answered as replays). Its next claim says it has read the answer.
        await until(_claimed_after_carrying(proxy), "the worker read the carrying claim's answer")
    carried = carried_batches(proxy)
    sent = [batch.body["acks"] for batch in proxy.seen("POST", "/v1/acks")]
    sizes = [len(batch) for batch in carried + sent]
    assert sum(sizes) == 20 and max(sizes) > 1 and len(sizes) < 20
    assert carried, "no claim carried outcomes"
    assert sorted(ack["id"] for batch in carried + sent for ack in batch) == sorted(ids)
    assert not proxy.seen("POST", "/v1/jobs/{id}/complete")
    assert [(await stored(store, i))["result"] for i in ids] == list(range(20))


async def test_a_finished_job_is_freed_without_the_garbage_collector(
    proxy: FaultProxy, client: Client, store: JobStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A job whose handler uses none of checkpoints, suspend or children leaves no reference
    cycle behind: it is freed as soon as the worker is done with it, not by the cyclic
    garbage collector, whose runs over every job of a drain cost the worker more CPU than
    the rest of the job's own work (docs/benchmarks/2026-11-29-worker-cpu-per-job.md)."""
    # Stopped while a claim carries the last outcomes, the worker sends them again and warns
    # with the claim's error as an argument; pytest keeps every record of the test, and the
    # error's traceback the frames that held those outcomes' jobs. Not a reference the
    # worker keeps: warnings of the worker are left out here.
    caplog.set_level(logging.ERROR, logger="evora.worker")
    worker = make_worker(proxy, concurrency=10)
    handled: list[weakref.ref[evora.Job]] = []

    @worker.handler("t")
    async def handle(job: evora.Job) -> None:
        handled.append(weakref.ref(job))

    submitted: list[Submission] = [{"queue": "q", "type": "t"} for _ in range(10)]
    ids = [r.id for r in await client.submit_batch(submitted)]
    gc.disable()
    try:
        async with serving(worker):
            await until(all_in_state(store, ids, "COMPLETED"), "all completed")
        assert len(handled) == 10
        assert [ref() for ref in handled] == [None] * 10
    finally:
        gc.enable()


async def test_the_worker_asks_for_the_running_loop_per_claim_not_per_job(
    proxy: FaultProxy, client: Client, store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Python 3.11 `asyncio.get_running_loop()` makes a getpid() system call (its check
    for a fork): asked for each job's task and each outcome's future, that was 7 % of the
    worker's CPU in a drain (docs/benchmarks/2026-11-29-dispatcher-and-worker-cpu.md). The
    worker and its ack batcher keep the loop they started on."""
    asked = 0
    get_running_loop = asyncio.get_running_loop

    def counting() -> asyncio.AbstractEventLoop:
        nonlocal asked
        if sys._getframe(1).f_globals["__name__"].startswith("evora.sdk"):
            asked += 1
        return get_running_loop()

    worker = make_worker(proxy, concurrency=10)

    @worker.handler("t")
    async def handle(job: evora.Job) -> None:
        pass

    submitted: list[Submission] = [{"queue": "q", "type": "t"} for _ in range(30)]
    ids = [r.id for r in await client.submit_batch(submitted)]
    monkeypatch.setattr(asyncio, "get_running_loop", counting)
    async with serving(worker):
        await until(all_in_state(store, ids, "COMPLETED"), "all completed")
    # A few per claim and per batch of outcomes (3 to 30 of each here), none per job.
    assert asked < len(ids), asked


async def test_run_settles_the_collector_as_a_service_does(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    """`Worker.run()` owns its process, as `evora worker` does: what was built to start is
    frozen out of the collector's scans and young collections are rarer, as in the services
    (evora.collector); in a drain the collector had been a quarter of the worker's CPU."""
    worker = make_worker(proxy)
    seen: list[tuple[int, int]] = []

    @worker.handler("t")
    async def handle(job: evora.Job) -> None:
        seen.append((gc.get_threshold()[0], gc.get_freeze_count()))

    job_id = (await client.submit("q", "t")).id
    threshold = gc.get_threshold()
    # run() is this on a loop of its own, which a test's loop cannot start.
    serving_task = asyncio.create_task(worker._serve_until_signalled())
    try:
        await until(in_state(store, job_id, "COMPLETED"), "completed")
    finally:
        await asyncio.wait_for(worker.stop(), 10)
        await serving_task
        gc.unfreeze()
        gc.set_threshold(*threshold)
    assert seen == [(GC_YOUNG_THRESHOLD, seen[0][1])]
    assert seen[0][1] > 0


async def test_a_lone_outcome_is_not_delayed_by_the_linger(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    worker = make_worker(proxy, handlers=example_handlers, ack_linger=30)
    job_id = (await client.submit("q", "demo.echo")).id
    async with serving(worker):
        await until(in_state(store, job_id, "COMPLETED"), within=10)


async def test_claimed_handlers_start_before_the_next_claim_is_sent(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    """The submitter waits for the handler to start, not for the worker's next claim: the
    handlers of a claim's jobs begin before that claim is built and sent."""
    order: list[str] = []
    worker = make_worker(proxy)

    @worker.handler("t")
    async def handler(job: evora.Job) -> None:
        order.append("handler")

    send = worker._http.request

    async def recording(method: str, path: str, **kwargs: Any) -> Any:
        if path == "/v1/claim":
            order.append("claim")
        return await send(method, path, **kwargs)

    worker._http.request = recording  # type: ignore[method-assign]
    job_id = (await client.submit("q", "t")).id
    async with serving(worker):
        await until(in_state(store, job_id, "COMPLETED"))
    assert order[:3] == ["claim", "handler", "claim"]


async def test_a_rejected_batch_is_reported_job_by_job(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    proxy.fault("POST", "/v1/acks", 413)
    worker = make_worker(proxy, handlers=example_handlers)
    job_id = (await client.submit("q", "demo.echo", [1, 2])).id
    async with serving(worker):
        await until(in_state(store, job_id, "COMPLETED"))
    assert proxy.seen("POST", "/v1/jobs/{id}/complete")[0].body["result"] == [1, 2]


async def test_acks_are_retried_while_the_dispatcher_is_unavailable(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    for status in (503, 502):
        proxy.fault("POST", "/v1/acks", status)
    worker = make_worker(proxy, handlers=example_handlers)
    job_id = (await client.submit("q", "demo.echo")).id
    async with serving(worker):
        await until(in_state(store, job_id, "COMPLETED"))
    assert len(proxy.seen("POST", "/v1/acks")) == 3


async def test_stop_lets_running_jobs_finish_within_the_grace_and_releases_the_rest(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    grace = 2.0
    # The quick job must still run when the grace period ends: it finishes only after the
    # long-poll was seen abandoned and a job was submitted through the api, which a loaded
    # machine can take well over half a second to do.
    worker = make_worker(proxy, concurrency=3, grace_period=grace)
    finish = asyncio.Event()
    started: set[str] = set()

    @worker.handler("quick")
    async def quick(job: evora.Job) -> str:
        started.add(job.id)
        await finish.wait()
        return "finished during the grace period"

    @worker.handler("slow")
    async def slow(job: evora.Job) -> None:
        started.add(job.id)
        await asyncio.Event().wait()

    quick_id = (await client.submit("q", "quick")).id
    slow_id = (await client.submit("q", "slow")).id
    task = asyncio.create_task(worker.serve())
    # Both handlers run (not merely claimed: the claim carrying them could still be on its
    # way, and that in-flight claim is not the long-poll waited for next) and the third slot
    # waits in a long-poll of 30 s.
    await until(lambda: started == {quick_id, slow_id}, "both handlers running")
    await until(lambda: proxy.in_flight["/v1/claim"] == 1, "a long-poll for the third slot")
    loop = asyncio.get_running_loop()
    stop_started = loop.time()
    stopping = asyncio.create_task(worker.stop())
    # the long-poll was abandoned
    await until(lambda: proxy.in_flight["/v1/claim"] == 0, "the long-poll abandoned")
    late_id = (await client.submit("q", "quick")).id
    finish.set()
    # the slow handler had the whole grace period; the 30 s long-poll was not waited out
    await asyncio.wait_for(stopping, grace + 10)
    assert loop.time() - stop_started >= grace
    await task
    assert (await stored(store, quick_id))["state"] == "COMPLETED"
    slow_job = await stored(store, slow_id)
    assert slow_job["state"] == "PENDING" and slow_job["attempt"] == 0
    assert (await stored(store, late_id))["state"] == "PENDING"  # claiming stopped with stop()
    assert [r.path for r in proxy.seen("POST", "/v1/jobs/{id}/release")] == [
        f"/v1/jobs/{slow_id}/release"
    ]


async def test_stop_gives_up_on_a_handler_that_ignores_cancellation(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    worker = make_worker(proxy, grace_period=0.5, shutdown_timeout=0.2)
    started, let_go = asyncio.Event(), asyncio.Event()
    cancellations = 0

    @worker.handler("t")
    async def stubborn(job: evora.Job) -> str:
        nonlocal cancellations
        started.set()
        while not let_go.is_set():
            try:
                await let_go.wait()
            except asyncio.CancelledError:
                cancellations += 1
        return "too late"

    job_id = (await client.submit("q", "t", lease_seconds=1)).id  # a heartbeat every 1/3 s
    task = asyncio.create_task(worker.serve())
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.wait_for(worker.stop(), 5)
    await task
    assert cancellations == 2  # at the end of the grace period, then when given up on
    heartbeats = len(proxy.seen("POST", "/v1/jobs/{id}/heartbeat"))
    assert heartbeats > 0
    await asyncio.sleep(0.5)  # sampling, not synchronising: no heartbeats after giving up
    assert len(proxy.seen("POST", "/v1/jobs/{id}/heartbeat")) == heartbeats
    # Still running the handler; nothing is left waiting to report once that has ended.
    running = [t for t in asyncio.all_tasks() if t.get_name().endswith(job_id)]
    assert running
    let_go.set()
    _, pending = await asyncio.wait(running, timeout=5)
    assert not pending
    assert (await stored(store, job_id))["state"] == "RUNNING"
    assert not proxy.seen("POST", "/v1/acks") and not proxy.seen("POST", "/v1/jobs/{id}/release")


async def test_outcomes_handed_to_a_claim_that_stop_cancels_are_still_recorded(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    """The last handler of a full claim asks the worker to stop: the batch of outcomes that
    frees the slots is handed to the next claim in the same moment as stop() cancels the
    claim loop, before that claim is sent. The outcomes go by POST /v1/acks instead, and
    stop() returns without waiting out the grace period."""
    # A grace period far longer than the acks' round trip on a loaded machine, so a stop()
    # that waited it out cannot be mistaken for one that did not.
    grace = 10.0
    worker = make_worker(proxy, concurrency=2, grace_period=grace, shutdown_timeout=grace)
    handled: list[str] = []
    last_handled = asyncio.Event()

    @worker.handler("t")
    async def handle(job: evora.Job) -> None:
        handled.append(job.id)
        if len(handled) == 2:
            last_handled.set()

    ids = [(await client.submit("q", "t")).id for _ in range(2)]
    task = asyncio.create_task(worker.serve())
    # Awaited directly, not through wait_for (a task of its own): stop() must run in the
    # same turn of the loop as the batcher hands the outcomes over, before the claim loop.
    await last_handled.wait()
    loop = asyncio.get_running_loop()
    stop_started = loop.time()
    await worker.stop()  # bounded: the grace period and shutdown_timeout
    await task
    assert loop.time() - stop_started < grace / 2  # not the grace period: nothing was left running
    assert [(await stored(store, i))["state"] for i in ids] == ["COMPLETED"] * 2
    assert sorted(a["id"] for b in proxy.seen("POST", "/v1/acks") for a in b.body["acks"]) == (
        sorted(ids)
    )


async def test_the_claim_loop_survives_the_dispatcher_going_away(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    class CountFailures(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0
            self.several = asyncio.Event()

        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("claim failed"):
                self.count += 1
                if self.count >= 3:
                    self.several.set()

    failures = CountFailures()
    logger = logging.getLogger("evora.worker")
    logger.addHandler(failures)
    try:
        await proxy.stop()
        worker = make_worker(proxy, handlers=example_handlers)
        async with serving(worker):
            await asyncio.wait_for(failures.several.wait(), 5)
            await proxy.start()  # the same port: a dispatcher restart
            job_id = (await client.submit("q", "demo.echo", "back")).id
            await until(in_state(store, job_id, "COMPLETED"))
    finally:
        logger.removeHandler(failures)
    assert (await stored(store, job_id))["result"] == "back"


async def test_a_refused_token_stops_serve_with_the_error(services: Services) -> None:
    worker = Worker(services.dispatcher.url, "wrong", ["q"], handlers=example_handlers)
    with pytest.raises(evora.UnauthorizedError):
        await asyncio.wait_for(worker.serve(), 5)


async def test_jobs_of_a_type_without_handler_fail_retryably(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    worker = make_worker(proxy, handlers=example_handlers, types=["demo.echo", "mystery"])
    job_id = (await client.submit("q", "mystery")).id
    async with serving(worker):
        await until(lambda: failed(store, job_id), "the failure recorded")
    unknown = await stored(store, job_id)
    assert unknown["last_error"]["type"] == "UnknownJobType" and unknown["state"] == "PENDING"


async def test_sigterm_stops_the_worker_command_gracefully(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    code = (
        "import sys\n"
        "from evora.sdk.loading import run_worker_from_module\n"
        f"sys.exit(run_worker_from_module('examples.worker_example', url={proxy.url!r},"
        f" token={WORKER_TOKEN!r}, queues=['demo'], concurrency=2))\n"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("EVORA_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, cwd=REPO, env=env, stderr=asyncio.subprocess.PIPE
    )
    try:
        job_id = (await client.submit("demo", "demo.sleep", {"seconds": 0.5})).id
        # Bounded by a new Python process importing the SDK before it claims: under load that
        # alone took over 10 s.
        await until(in_state(store, job_id, "RUNNING"), within=60)
        # The job is in the worker's hands once the worker sent its next claim (it does so
        # after starting the handlers of the last answer). RUNNING alone is not enough: a
        # signal between the claim's commit and the worker reading the answer leaves the job
        # to its lease, the stop race worker.py documents (seen in about 1 of 20 runs).
        await until(lambda: len(proxy.seen("POST", "/v1/claim")) >= 2, within=10)
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr.decode()
    done = await stored(store, job_id)
    assert done["state"] == "COMPLETED" and done["result"] == {"slept": 0.5}


async def test_unacked_outcomes_hold_their_slots(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    """While the dispatcher cannot take acks, a worker holds no more than twice its
    concurrency in jobs: those whose outcomes are in the batch being retried, and finished
    ones whose outcomes wait for it and keep their slots, so outcomes never pile up (and
    leases never run out under finished jobs)."""
    for _ in range(6):
        proxy.fault("POST", "/v1/acks", 503)
        proxy.fault("POST", "/v1/claim", 503, with_acks=True)
    worker = make_worker(proxy, concurrency=2, handlers=example_handlers)
    ids = [(await client.submit("q", "demo.echo", {"n": n})).id for n in range(10)]
    most_outstanding = 0

    async def states() -> list[str]:
        return [(await stored(store, i))["state"] for i in ids]

    async with serving(worker):
        deadline = asyncio.get_running_loop().time() + 10
        while (now := await states()) != ["COMPLETED"] * len(ids):
            most_outstanding = max(most_outstanding, now.count("RUNNING"))
            assert asyncio.get_running_loop().time() < deadline
    assert most_outstanding <= 4
    # the failed attempts were retried, by either way
    assert len(proxy.seen("POST", "/v1/acks")) + len(carried_batches(proxy)) >= 7


async def test_the_next_claim_overlaps_the_outcomes_on_their_way(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    """A job's slot is freed when its outcome is sent, not when the dispatcher has answered:
    when the claim that outcome makes due is refused (a slow 503), the outcome goes again by
    `POST /v1/acks` and the worker claims again while that slow ack is on its way; the jobs
    so claimed keep their slots until their own outcomes go out."""
    proxy.fault("POST", "/v1/claim", 503, with_acks=True)
    proxy.fault("POST", "/v1/acks", 503, delay=5.0)  # the retry's answer is slow (then retried)
    worker = make_worker(proxy, concurrency=2, handlers=example_handlers)
    ids = [(await client.submit("q", "demo.echo", {"n": n})).id for n in range(6)]

    async def taken() -> int:
        return sum([(await stored(store, i))["state"] != "PENDING" for i in ids])

    async def at_least_four_taken() -> bool:
        return await taken() >= 4

    async with serving(worker):
        await until(at_least_four_taken, "four jobs claimed", within=4)
        assert len(proxy.seen("POST", "/v1/acks")) == 1  # the first batch is still on its way
        assert await taken() == 4  # the second pair's outcomes wait, holding their slots
        await until(all_in_state(store, ids, "COMPLETED"), "all completed")


async def test_a_backlog_drains_with_outcomes_riding_the_claims(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    """A backlog larger than many claims: every outcome is recorded, by claims or acks."""
    worker = make_worker(proxy, concurrency=50)

    @worker.handler("t")
    async def handle(job: evora.Job) -> None:
        return None

    ids = [r.id for r in await client.submit_batch([{"queue": "q", "type": "t"}] * 600)]
    async with serving(worker):
        await until(all_in_state(store, ids, "COMPLETED"), "all completed", within=60)
        # COMPLETED may come before the worker read the answer of the claim carrying the last
        # outcomes: stopped then, it sends them again (test_outcomes_are_batched_under_load).
        await until(_claimed_after_carrying(proxy), "the worker read the carrying claim's answer")
    carried = carried_batches(proxy)
    sent = [batch.body["acks"] for batch in proxy.seen("POST", "/v1/acks")]
    assert sorted(a["id"] for b in carried + sent for a in b) == sorted(ids)
    assert carried
