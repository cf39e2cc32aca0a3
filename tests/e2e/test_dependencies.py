"""Workflows through the whole system: `Client` submits graphs of jobs to the api, several
concurrent `Worker`s run them, and the database alone decides when a waiting job may run."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime

from evora import Handlers, Job, Submission
from tests.e2e.conftest import Stack


def _at(event: dict[str, object]) -> datetime:
    return datetime.fromisoformat(str(event["at"]))


async def test_diamond_starts_the_join_once_after_both_branches_completed(
    stack: Stack,
) -> None:
    queue = "e2e-diamond"
    handlers = Handlers()
    runs: Counter[str] = Counter()

    @handlers.job("step")
    async def step(job: Job) -> str:
        runs[job.id] += 1
        await asyncio.sleep(0.05)  # long enough for the branches to overlap
        return str(job.payload["name"])

    def step_item(name: str, *after: str) -> Submission:
        deps = [f"ref:{d}" for d in after]
        payload = {"name": name}
        return {"queue": queue, "type": "step", "payload": payload, "ref": name, "depends_on": deps}

    items = [step_item("a"), step_item("b", "a"), step_item("c", "a"), step_item("d", "b", "c")]
    a, b, c, d = (r.id for r in await stack.client.submit_batch(items))
    for _ in range(3):
        stack.start(stack.worker(handlers, [queue], concurrency=4))
    await stack.wait_for_states(queue, {"COMPLETED": 4}, within=60)

    assert runs == Counter({a: 1, b: 1, c: 1, d: 1})
    events = {job: await stack.client.events(job) for job in (a, b, c, d)}
    assert [e["event"] for e in events[d]] == [
        "submitted",
        "dependencies_met",
        "claimed",
        "completed",
    ]
    started = _at(next(e for e in events[d] if e["event"] == "claimed"))
    for branch in (b, c):
        done = next(e for e in events[branch] if e["event"] == "completed")
        assert _at(done) <= started
    assert (await stack.client.dependents(a)).jobs[0]["id"] in {b, c}


async def test_fan_in_of_1000_parents_releases_the_child_exactly_once(stack: Stack) -> None:
    queue = "e2e-fan-in"
    handlers = Handlers()
    runs: Counter[str] = Counter()

    @handlers.job("leaf")
    async def leaf(job: Job) -> None:
        runs[job.id] += 1

    @handlers.job("join")
    async def join(job: Job) -> None:
        runs[job.id] += 1

    leaves: list[Submission] = [{"queue": queue, "type": "leaf"} for _ in range(1000)]
    parents = [r.id for r in await stack.client.submit_batch(leaves)]
    child = await stack.client.submit(queue, "join", depends_on=parents)
    assert child.job["state"] == "WAITING"
    for _ in range(4):
        stack.start(stack.worker(handlers, [queue], concurrency=16))
    await stack.wait_for_states(queue, {"COMPLETED": 1001}, within=120)

    assert set(runs.values()) == {1} and len(runs) == 1001
    assert await stack.event_names(child.id) == [
        "submitted",
        "dependencies_met",
        "claimed",
        "completed",
    ]
    # decided in the transaction of a parent's completion, not by a later poll
    parents_in_that_transaction = await stack.pool.fetchval(
        "SELECT count(*) FROM job_events m JOIN job_events p ON p.xid = m.xid "
        "WHERE m.job_id = $1::uuid AND m.event = 'dependencies_met' "
        "AND p.event = 'completed' AND p.job_id <> m.job_id",
        child.id,
    )
    assert parents_in_that_transaction >= 1


async def test_a_parent_discarded_from_the_dlq_cancels_the_subtree_and_run_still_runs(
    stack: Stack,
) -> None:
    queue = "e2e-dlq"
    handlers = Handlers()
    ran: list[str] = []

    @handlers.job("boom")
    async def boom(job: Job) -> None:
        raise RuntimeError("no")

    @handlers.job("ok")
    async def ok(job: Job) -> None:
        ran.append(job.id)

    items: list[Submission] = [
        {"queue": queue, "type": "boom", "max_attempts": 1, "ref": "p"},
        {"queue": queue, "type": "ok", "depends_on": ["ref:p"], "ref": "child"},
        {"queue": queue, "type": "ok", "depends_on": ["ref:child"]},
        {"queue": queue, "type": "ok", "depends_on": ["ref:p"], "on_dependency_failure": "run"},
    ]
    p, child, grandchild, runner = (r.id for r in await stack.client.submit_batch(items))
    stack.start(stack.worker(handlers, [queue], concurrency=4))
    stack.start(stack.worker(handlers, [queue], concurrency=4))
    await stack.wait_for_states(queue, {"DLQ": 1, "WAITING": 3}, within=60)
    await stack.admin.discard(p)
    await stack.wait_for_states(queue, {"CANCELLED": 3, "COMPLETED": 1}, within=60)
    assert ran == [runner]
    cancelled = (await stack.client.events(grandchild))[-1]
    assert cancelled["event"] == "cancelled"
    assert cancelled["data"] == {"reason": "dependency_cancelled", "dependency": child}
