"""A handler that makes its job wait for children (`await job.spawn_children([...])`,
docs/jobs-that-wait.md): the worker stops its heartbeats and reports nothing; the children run;
the job's next run, the same attempt number, reads their results from
`job.dependency_results`."""

from __future__ import annotations

import evora
from evora import Client
from evora.storage.jobs import JobStore
from tests.polling import until
from tests.sdk.fake import FaultProxy
from tests.sdk.test_worker import in_state, make_worker, serving, stored


async def test_a_handler_spawns_children_and_its_next_run_sees_their_results(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    worker = make_worker(proxy)
    spawned: list[list[str]] = []

    @worker.handler("sum")
    async def total(job: evora.Job) -> object:
        if not job.dependency_results:
            spawned.append(
                await job.spawn_children(
                    [{"queue": "q", "type": "square", "payload": {"n": n}} for n in range(3)]
                )
            )
            return "dropped: the job waits for its children"
        return sum(job.dependency_results.values())

    @worker.handler("square")
    async def square(job: evora.Job) -> int:
        n: int = job.payload["n"]
        return n * n

    job_id = (await client.submit("q", "sum", max_attempts=1)).id
    async with serving(worker):
        await until(in_state(store, job_id, "COMPLETED"))
    job = await stored(store, job_id)
    # the first run's return was dropped (it would have completed the job), and waiting used
    # up no attempt of the one it has
    assert (job["attempt"], job["result"]) == (1, 0 + 1 + 4)
    [children] = spawned
    assert [str(c) for c in job["depends_on"]] == children
    events = [e["event"] for e in await store.events(job["id"])]
    assert events == [
        "submitted",
        "claimed",
        "awaiting_children",
        "dependencies_met",
        "claimed",
        "completed",
    ]
