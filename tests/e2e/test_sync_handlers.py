"""Handlers that block, and plain `def` handlers, on a real api, dispatcher and PostgreSQL.

Where a handler may block the event loop, the worker is a real `evora worker MODULE` child
process: a worker in this process would share the test's event loop with the servers, so a
handler blocking it would block them too.

Jobs here have a 2 s lease (a heartbeat every 2/3 s) and their handlers take 4 s; lease
expiry, the sweeper's job, is done by a task of the test every tenth of a second.

- A plain `def` handler that sleeps runs in a thread: it completes once, in one attempt,
  and a job running beside it on the same worker keeps its lease too.
- An `async def` handler that sleeps blocks the worker's event loop: the watchdog names it
  in a warning, and the damage it warns about is there: neither that job nor the one beside
  it could heartbeat, both leases expired, and both jobs ended in the DLQ although their
  handlers succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

from evora import Handlers, Job, Submission
from evora.storage.jobs import JobStore
from tests.e2e.conftest import Child, Children, LogRecords, Stack, child_env, evora_command
from tests.servers import WORKER_TOKEN

HANDLER_SECONDS = 4.0
LEASE_SECONDS = 2

WORKER_MODULE = """
import asyncio
import os
import pathlib
import threading
import time

import evora

handlers = evora.Handlers()
RUNS = pathlib.Path(os.environ["E2E_RUNS"])
SECONDS = float(os.environ["E2E_HANDLER_SECONDS"])


def record(job: evora.Job) -> None:
    with (RUNS / job.id).open("a") as runs:
        runs.write(f"{job.attempt}\\n")


@handlers.job("e2e.sleep_in_def")
def sleep_in_def(job: evora.Job) -> dict:
    record(job)
    time.sleep(SECONDS)
    return {"thread": threading.current_thread().name}


@handlers.job("e2e.sleep_in_async")
async def sleep_in_async(job: evora.Job) -> dict:
    record(job)
    time.sleep(SECONDS)  # blocks the event loop: the mistake the watchdog points out
    return {"thread": threading.current_thread().name}


@handlers.job("e2e.steady")
async def steady(job: evora.Job) -> dict:
    record(job)
    await asyncio.sleep(SECONDS)
    return {"steady": True}
"""


@contextlib.asynccontextmanager
async def expiring_leases(stack: Stack) -> AsyncIterator[None]:
    """What the sweeper does, every 0.1 s: requeue (or dead-letter) jobs whose lease ran out."""
    store = JobStore(stack.pool)

    async def sweep() -> None:
        while True:
            await store.expire_leases()
            await asyncio.sleep(0.1)

    task = asyncio.create_task(sweep())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.close()


async def run_beside_steady(
    stack: Stack, children: Children, tmp_path: Path, queue: str, job_type: str
) -> tuple[Child, str, str, Path]:
    """A worker process running a `job_type` job and a `steady` one at once, until neither
    is RUNNING any more; returns the worker, both job ids and the directory of run records
    (a file per job, a line per run)."""
    (tmp_path / "e2e_blocking_worker.py").write_text(textwrap.dedent(WORKER_MODULE))
    runs = tmp_path / "runs"
    runs.mkdir()
    env = child_env(
        EVORA_DISPATCHER_URL=stack.dispatcher_url,
        EVORA_WORKER_TOKEN=WORKER_TOKEN,
        EVORA_WORKER_QUEUES=queue,
        EVORA_WORKER_CONCURRENCY="2",
        E2E_RUNS=str(runs),
        E2E_HANDLER_SECONDS=str(HANDLER_SECONDS),
    )
    worker = await children.spawn("worker", evora_command("worker", "e2e_blocking_worker"), env)
    # One attempt each: a lease lost shows as a job in the DLQ, not as a quiet retry.
    submissions: list[Submission] = [
        {"queue": queue, "type": kind, "lease_seconds": LEASE_SECONDS, "max_attempts": 1}
        for kind in ("e2e.steady", job_type)
    ]
    steady_id, job_id = [r.id for r in await stack.client.submit_batch(submissions)]

    def both_started() -> bool:
        if not worker.running:
            raise AssertionError(f"the worker exited:\n{worker.output()}")
        return (runs / steady_id).exists() and (runs / job_id).exists()

    async def both_ended() -> bool:
        return "RUNNING" not in await stack.states(queue)

    async with expiring_leases(stack):
        await stack.until(both_started, within=30, what="the worker runs both jobs")
        await stack.until(both_ended, within=30, what="both jobs ended")
    return worker, steady_id, job_id, runs


async def test_a_def_handler_that_sleeps_past_its_lease_runs_once_in_a_thread(
    stack: Stack, children: Children, tmp_path: Path
) -> None:
    queue = "e2e-sync-def"
    worker, steady_id, job_id, runs = await run_beside_steady(
        stack, children, tmp_path, queue, "e2e.sleep_in_def"
    )

    for one in (job_id, steady_id):
        job = await stack.client.get(one)
        assert job["state"] == "COMPLETED" and job["attempt"] == 1, (job, worker.output())
        assert await stack.event_names(one) == ["submitted", "claimed", "completed"]
        assert (runs / one).read_text() == "1\n", "the handler ran exactly once"
    job = await stack.client.get(job_id)
    assert job["result"]["thread"].startswith("evora-handler-"), job


async def test_an_async_handler_that_blocks_the_loop_is_named_in_a_warning(
    stack: Stack, children: Children, tmp_path: Path
) -> None:
    queue = "e2e-sync-async"
    worker, steady_id, job_id, runs = await run_beside_steady(
        stack, children, tmp_path, queue, "e2e.sleep_in_async"
    )

    # The default threshold is 1 s, far below the 4 s the handler blocks.
    await stack.until(
        lambda: "the event loop ran again after being blocked" in worker.output(),
        within=10,
        what="the watchdog reports the end of the block",
    )
    output = worker.output()
    warning = next(line for line in output.splitlines() if "has been blocked for" in line)
    assert f"job {job_id} (type 'e2e.sleep_in_async'" in warning, warning
    assert "e2e_blocking_worker.sleep_in_async" in warning, warning
    assert "e2e_blocking_worker.py" in warning and "in sleep_in_async" in warning, warning
    assert "asyncio.to_thread" in warning and "plain `def`" in warning, warning
    # Not the steady job: it was awaiting, not blocking.
    assert steady_id not in warning, warning

    # What it warns about: no heartbeat left the worker, so both leases ran out and both
    # jobs were dead-lettered, though both handlers returned.
    for one in (job_id, steady_id):
        job = await stack.client.get(one)
        assert job["state"] == "DLQ", (job, output)
        last = (await stack.client.events(one))[-1]
        assert last["event"] == "dead_lettered" and "lease_expired" in str(last), last
    assert (runs / job_id).read_text() == "1\n"


# A `def` handler leaves the event loop free, so from here on the worker runs in this
# process, beside the servers, where the test can watch the handler thread closely.


def wait_in_thread(event: threading.Event) -> None:
    """Block the handler thread until `event` (bounded, in case the test never sets it)."""
    if not event.wait(30):
        raise TimeoutError("the test never let the handler go on")


async def test_a_def_handler_reports_progress_and_stops_when_cancelled(stack: Stack) -> None:
    queue = "e2e-sync-cancel"
    handlers = Handlers()
    steps: list[int] = []

    @handlers.job("e2e.steps")
    def steps_until_cancelled(job: Job) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            steps.append(len(steps))
            job.progress({"step": len(steps)})
            job.raise_if_cancel_requested()
            time.sleep(0.02)
        return "never cancelled"

    stack.start(stack.worker(handlers, [queue], heartbeat_fraction=0.1, cancel_grace=10.0))
    job_id = (await stack.client.submit(queue, "e2e.steps", {}, lease_seconds=2)).id

    async def progress_seen() -> bool:
        progress = (await stack.client.get(job_id))["progress"]
        return isinstance(progress, dict) and progress["step"] > 1

    await stack.until(progress_seen, within=15, what="progress from the handler thread")
    await stack.client.cancel(job_id)

    async def cancelled() -> bool:
        return bool((await stack.client.get(job_id))["state"] == "CANCELLED")

    # Well within the cancel grace: the handler stopped on its own.
    await stack.until(cancelled, within=8, what="the handler stops on the cancel request")
    assert await stack.event_names(job_id) == [
        "submitted",
        "claimed",
        "cancel_requested",
        "cancelled",
    ]
    ran = len(steps)
    await asyncio.sleep(0.2)
    assert len(steps) == ran, "the handler thread stopped"


async def test_stop_releases_a_def_handler_still_running_and_discards_its_result(
    stack: Stack, worker_log: LogRecords
) -> None:
    queue = "e2e-sync-stop"
    handlers = Handlers()
    started, proceed, returned = threading.Event(), threading.Event(), threading.Event()

    @handlers.job("e2e.stuck")
    def stuck(job: Job) -> str:
        started.set()
        wait_in_thread(proceed)
        returned.set()
        return "too late"

    worker = stack.worker(handlers, [queue], grace_period=0.5)
    stack.start(worker)
    job_id = (await stack.client.submit(queue, "e2e.stuck", {})).id
    await stack.until(started.is_set, within=15, what="the handler started")

    began = time.monotonic()
    await asyncio.wait_for(worker.stop(), 20)
    # The thread still runs: stop() does not wait for it.
    assert time.monotonic() - began < 10 and not returned.is_set()
    job = await stack.client.get(job_id)
    assert job["state"] == "PENDING" and job["attempt"] == 0, job
    assert worker_log.saw(f"job {job_id}: its handler") and worker_log.saw("discarded")

    proceed.set()
    await stack.until(returned.is_set, within=10, what="the handler thread returns")
    await asyncio.sleep(0.2)  # room for a report that must not come
    assert (await stack.client.get(job_id))["state"] == "PENDING"
    assert await stack.event_names(job_id) == ["submitted", "claimed", "released"]


async def test_a_def_handler_given_up_on_keeps_its_slot_until_its_thread_returns(
    stack: Stack,
) -> None:
    """With concurrency 1, a handler thread that ignores a cancel request keeps the only
    slot after the worker released its job: the next job waits instead of running beside
    it, so abandoned threads never exceed `concurrency`."""
    queue = "e2e-sync-slot"
    handlers = Handlers()
    started, proceed = threading.Event(), threading.Event()
    ran: list[str] = []

    @handlers.job("e2e.stuck")
    def stuck(job: Job) -> str:
        started.set()
        wait_in_thread(proceed)
        return "too late"

    @handlers.job("e2e.next")
    def after(job: Job) -> str:
        ran.append(job.id)
        return "next"

    stack.start(
        stack.worker(handlers, [queue], concurrency=1, heartbeat_fraction=0.1, cancel_grace=0.2)
    )
    stuck_id = (await stack.client.submit(queue, "e2e.stuck", {}, lease_seconds=2)).id
    await stack.until(started.is_set, within=15, what="the handler started")
    next_id = (await stack.client.submit(queue, "e2e.next", {})).id
    await stack.client.cancel(stuck_id)

    async def stuck_cancelled() -> bool:
        return bool((await stack.client.get(stuck_id))["state"] == "CANCELLED")

    await stack.until(stuck_cancelled, within=15, what="the ignored cancel ends the job")
    await asyncio.sleep(0.5)  # room for a claim that must not happen
    assert ran == [] and (await stack.client.get(next_id))["state"] == "PENDING"

    proceed.set()
    await stack.wait_for_states(queue, {"CANCELLED": 1, "COMPLETED": 1}, within=15)
    assert ran == [next_id]
