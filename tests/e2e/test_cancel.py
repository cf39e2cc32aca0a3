"""Cancelling a RUNNING job end to end: `Client.cancel` sets `cancel_requested` (the 202
path), the worker learns it from a heartbeat, and the handler's reaction decides the end."""

from __future__ import annotations

import asyncio

import pytest

from evora import Handlers, InvalidStateError, Job
from tests.e2e.conftest import Stack

# (how the handler reacts, the state the job ends in, its events)
REACTIONS = [
    # stops as soon as it sees the request
    ("cooperates", "CANCELLED", ["submitted", "claimed", "cancel_requested", "cancelled"]),
    # never looks: the worker cancels it after `cancel_grace`
    ("ignores", "CANCELLED", ["submitted", "claimed", "cancel_requested", "cancelled"]),
    # sees the request but finishes its work: the result counts
    ("finishes", "COMPLETED", ["submitted", "claimed", "cancel_requested", "completed"]),
]


@pytest.mark.parametrize(("reaction", "final", "history"), REACTIONS)
async def test_cancelling_a_running_job_through_the_worker(
    stack: Stack, reaction: str, final: str, history: list[str]
) -> None:
    queue = f"e2e-cancel-{reaction}"
    handlers = Handlers()
    started = asyncio.Event()
    saw_cancel = asyncio.Event()
    never = asyncio.Event()
    ended: list[str] = []

    @handlers.job("wait.for.cancel")
    async def wait_for_cancel(job: Job) -> str:
        started.set()
        try:
            if reaction == "ignores":
                await never.wait()  # only the worker's cancellation gets it out
            await job.cancel_event.wait()
            saw_cancel.set()
            if reaction == "cooperates":
                job.raise_if_cancel_requested()
            return "finished anyway"
        except asyncio.CancelledError:
            ended.append("cancelled by the worker")
            raise

    # A short lease, so heartbeats (every 0.1 of it) bring the cancel request quickly.
    worker = stack.worker(
        handlers, [queue], concurrency=2, heartbeat_fraction=0.1, cancel_grace=0.5
    )
    stack.start(worker)
    job_id = (await stack.client.submit(queue, "wait.for.cancel", {}, lease_seconds=2)).id
    await stack.until(started.is_set, within=15, what="the handler started")

    answer = await stack.client.cancel(job_id)
    # RUNNING: the api only records the request (202) and leaves the end to the worker.
    assert answer["state"] == "RUNNING"
    assert answer["cancel_requested"] is True

    async def ended_in_final_state() -> bool:
        job = await stack.client.get(job_id)
        return bool(job["state"] == final)

    await stack.until(ended_in_final_state, within=20, what=f"the job is {final}")
    job = await stack.client.get(job_id)
    assert job["cancel_requested"] is True
    assert job["finished_at"] is not None
    assert job["lease_expires_at"] is None
    assert job["attempt"] == 1  # the attempt ran, however it was stopped
    if final == "COMPLETED":
        assert job["result"] == "finished anyway"
    assert await stack.event_names(job_id) == history
    if reaction == "ignores":
        assert ended == ["cancelled by the worker"]
        assert not saw_cancel.is_set()
    else:
        assert saw_cancel.is_set()
        assert ended == []

    # Final: a second cancel is refused.
    with pytest.raises(InvalidStateError):
        await stack.client.cancel(job_id)
