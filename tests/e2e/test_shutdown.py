"""Graceful worker shutdown end to end: `Worker.stop()` in this process, and SIGTERM to a
real `evora worker MODULE` process. In-flight jobs finish within the grace period, jobs
still running after it are released (PENDING, attempt not counted), nothing is lost."""

from __future__ import annotations

import asyncio
import signal
import textwrap
import time
from pathlib import Path

from evora import Handlers, Job, Submission
from tests.e2e.conftest import Children, Stack, child_env, evora_command
from tests.servers import WORKER_TOKEN


def gated_handlers(gate: asyncio.Event, started: list[str]) -> Handlers:
    handlers = Handlers()

    @handlers.job("e2e.slow")
    async def slow(job: Job) -> dict[str, str]:
        started.append(job.id)
        await gate.wait()
        return {"slow": job.id}

    @handlers.job("e2e.quick")
    async def quick(job: Job) -> dict[str, str]:
        started.append(job.id)
        return {"quick": job.id}

    return handlers


def slow_and_quick(queue: str, slow: int, quick: int) -> list[Submission]:
    # The slow ones first (lower priority value), so they are what fills the worker.
    first: list[Submission] = [
        {"queue": queue, "type": "e2e.slow", "priority": -1} for _ in range(slow)
    ]
    return first + [{"queue": queue, "type": "e2e.quick"} for _ in range(quick)]


async def finish_with_a_new_worker(stack: Stack, queue: str, total: int, left: list[str]) -> None:
    """The jobs `left` behind are still there and a new worker completes them."""
    gate = asyncio.Event()
    gate.set()
    started: list[str] = []
    stack.start(stack.worker(gated_handlers(gate, started), [queue], concurrency=4))
    await stack.wait_for_states(queue, {"COMPLETED": total}, within=30)
    assert sorted(started) == sorted(left)
    for job_id in left:
        job = await stack.client.get(job_id)
        assert job["result"] in ({"slow": job_id}, {"quick": job_id}), job


async def test_stop_lets_in_flight_jobs_finish_and_claims_nothing_more(stack: Stack) -> None:
    queue = "e2e-stop"
    gate = asyncio.Event()
    started: list[str] = []
    worker = stack.worker(gated_handlers(gate, started), [queue], concurrency=2, grace_period=20.0)
    stack.start(worker)
    results = await stack.client.submit_batch(slow_and_quick(queue, slow=2, quick=4))
    ids = [r.id for r in results]
    slow_ids, quick_ids = ids[:2], ids[2:]
    await stack.until(lambda: len(started) == 2, within=15, what="both slots busy")
    assert sorted(started) == sorted(slow_ids)

    began = time.monotonic()
    # stop() asks the worker to stop in its first step, which runs before the handlers
    # see the gate open: the freed slots must not claim anything more.
    stopping = asyncio.create_task(worker.stop())
    gate.set()
    await asyncio.wait_for(stopping, 20)
    took = time.monotonic() - began
    assert took < 10, f"stop() took {took:.1f}s although the jobs finished at once"

    for job_id in slow_ids:
        job = await stack.client.get(job_id)
        assert job["state"] == "COMPLETED" and job["result"] == {"slow": job_id}
    for job_id in quick_ids:
        job = await stack.client.get(job_id)
        assert job["state"] == "PENDING" and job["attempt"] == 0, job
        assert await stack.event_names(job_id) == ["submitted"]
    assert sorted(started) == sorted(slow_ids)

    await finish_with_a_new_worker(stack, queue, len(ids), quick_ids)


async def test_stop_releases_jobs_still_running_after_the_grace_period(stack: Stack) -> None:
    queue = "e2e-grace"
    gate = asyncio.Event()  # never opened while the first worker runs
    started: list[str] = []
    worker = stack.worker(gated_handlers(gate, started), [queue], concurrency=2, grace_period=0.5)
    stack.start(worker)
    results = await stack.client.submit_batch(slow_and_quick(queue, slow=2, quick=3))
    ids = [r.id for r in results]
    await stack.until(lambda: len(started) == 2, within=15, what="both slots busy")

    began = time.monotonic()
    await asyncio.wait_for(worker.stop(), 20)
    took = time.monotonic() - began
    assert 0.5 <= took < 10, took

    # Released: back to PENDING, the attempt not counted, nothing RUNNING left behind.
    assert await stack.states(queue) == {"PENDING": 5}
    for job_id in ids[:2]:
        job = await stack.client.get(job_id)
        assert job["attempt"] == 0 and job["worker_id"] is not None, job
        assert await stack.event_names(job_id) == ["submitted", "claimed", "released"]
    for job_id in ids[2:]:
        assert await stack.event_names(job_id) == ["submitted"]

    await finish_with_a_new_worker(stack, queue, len(ids), ids)
    for job_id in ids[:2]:
        assert (await stack.client.get(job_id))["attempt"] == 1


WORKER_MODULE = """
import asyncio
import os
import pathlib

import evora

handlers = evora.Handlers()
SIGNALS = pathlib.Path(os.environ["E2E_SIGNALS"])


@handlers.job("e2e.slow")
async def slow(job: evora.Job) -> dict:
    (SIGNALS / f"started-{job.id}").touch()
    # Runs until the test says so (bounded, in case it never does).
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while not (SIGNALS / "go").exists():
        if loop.time() > deadline:
            raise TimeoutError("never told to go")
        await asyncio.sleep(0.02)
    return {"slow": job.id, "pid": os.getpid()}


@handlers.job("e2e.quick")
async def quick(job: evora.Job) -> dict:
    return {"quick": job.id}
"""


async def test_sigterm_to_an_evora_worker_process_finishes_in_flight_jobs(
    stack: Stack, children: Children, tmp_path: Path
) -> None:
    queue = "e2e-sigterm"
    (tmp_path / "e2e_sigterm_worker.py").write_text(textwrap.dedent(WORKER_MODULE))
    signals = tmp_path / "signals"
    signals.mkdir()
    env = child_env(
        EVORA_DISPATCHER_URL=stack.dispatcher_url,
        EVORA_WORKER_TOKEN=WORKER_TOKEN,
        EVORA_WORKER_QUEUES=queue,
        EVORA_WORKER_CONCURRENCY="2",
        E2E_SIGNALS=str(signals),
    )
    # Importable because it lies in the directory the command runs in.
    worker = await children.spawn("worker", evora_command("worker", "e2e_sigterm_worker"), env)

    results = await stack.client.submit_batch(slow_and_quick(queue, slow=2, quick=4))
    ids = [r.id for r in results]
    slow_ids, quick_ids = ids[:2], ids[2:]

    def both_started() -> bool:
        if not worker.running:
            raise AssertionError(f"the worker exited:\n{worker.output()}")
        return all((signals / f"started-{job_id}").exists() for job_id in slow_ids)

    await stack.until(both_started, within=30, what="the worker process runs both slow jobs")
    assert await stack.states(queue) == {"RUNNING": 2, "PENDING": 4}

    worker.send(signal.SIGTERM)
    await stack.until(
        lambda: "SIGTERM: stopping" in worker.output(),
        within=15,
        what="the worker process acknowledges SIGTERM",
    )
    (signals / "go").touch()
    assert await worker.wait(within=20) == 0, worker.output()

    for job_id in slow_ids:
        job = await stack.client.get(job_id)
        assert job["state"] == "COMPLETED", job
        assert job["result"] == {"slow": job_id, "pid": worker.pid}
    for job_id in quick_ids:
        job = await stack.client.get(job_id)
        assert job["state"] == "PENDING" and job["attempt"] == 0, job
    assert "could not be reported" not in worker.output()

    await finish_with_a_new_worker(stack, queue, len(ids), quick_ids)
