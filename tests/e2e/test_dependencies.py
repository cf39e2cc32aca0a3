"""Workflows through the whole system: `Client` submits graphs of jobs to the api, several
concurrent `Worker`s run them, and the database alone decides when a waiting job may run."""

from __future__ import annotations

import asyncio
import random
import signal
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any
from uuid import UUID

from evora import Handlers, Job, Submission
from evora.storage.jobs import JobStore
from tests.e2e.conftest import (
    Child,
    Children,
    Stack,
    child_env,
    evora_command,
    free_port,
    scrape,
    spawn_service,
)
from tests.servers import WORKER_TOKEN


def _seq(events: list[dict[str, Any]], name: str) -> int:
    """The seq of the first event called `name`. Events of different jobs are ordered by seq,
    not by `at`: `at` is the writing transaction's start, and a claim whose transaction began
    a moment before another job's change committed may still see that change (its snapshot
    comes later), with the earlier `at`. A seq is taken as the row is written."""
    return int(next(e for e in events if e["event"] == name)["seq"])


async def test_diamond_starts_the_join_once_after_both_branches_completed(
    stack: Stack,
) -> None:
    queue = "e2e-diamond"
    handlers = Handlers()
    runs: Counter[str] = Counter()
    results_seen: dict[str, dict[str, object]] = {}

    @handlers.job("step")
    async def step(job: Job) -> str:
        runs[job.id] += 1
        results_seen[job.id] = dict(job.dependency_results)
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
    # each step gets what the steps it waited for returned
    assert results_seen == {a: {}, b: {a: "a"}, c: {a: "a"}, d: {b: "b", c: "c"}}
    events = {job: await stack.client.events(job) for job in (a, b, c, d)}
    assert [e["event"] for e in events[d]] == [
        "submitted",
        "dependencies_met",
        "claimed",
        "completed",
    ]
    started = _seq(events[d], "claimed")
    for branch in (b, c):
        assert _seq(events[branch], "completed") < started
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
        "SELECT count(*) FROM evora.job_events m JOIN evora.job_events p ON p.xid = m.xid "
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


KILLED_WORKER_MODULE = """
import asyncio
import os
import pathlib

import evora

handlers = evora.Handlers()
SIGNALS = pathlib.Path(os.environ["E2E_SIGNALS"])


@handlers.job("step")
async def step(job: evora.Job) -> str:
    if job.payload.get("hang"):
        (SIGNALS / "hanging").touch()
        await asyncio.sleep(60)  # until the test kills this process
    return job.payload["name"]
"""


def _diamond_with_a_hanging_b(queue: str, lease_seconds: int) -> list[Submission]:
    """A -> B, C -> D with short leases and quick retries; whoever first runs B hangs."""

    def item(name: str, *after: str, hang: bool = False) -> Submission:
        return {
            "queue": queue,
            "type": "step",
            "payload": {"name": name, "hang": hang},
            "ref": name,
            "depends_on": [f"ref:{d}" for d in after],
            "lease_seconds": lease_seconds,
            "backoff": {"initial_seconds": 0.1, "max_seconds": 0.2},
        }

    return [item("a"), item("b", "a", hang=True), item("c", "a"), item("d", "b", "c")]


async def _worker_process_hanging_in_b(
    stack: Stack, children: Children, tmp_path: Path, queue: str
) -> Child:
    """A real worker process serving `queue`, returned once it has completed A and C and
    hangs in B."""
    (tmp_path / "e2e_dependency_worker.py").write_text(textwrap.dedent(KILLED_WORKER_MODULE))
    signals = tmp_path / "signals"
    signals.mkdir()
    env = child_env(
        EVORA_DISPATCHER_URL=stack.dispatcher_url,
        EVORA_WORKER_TOKEN=WORKER_TOKEN,
        EVORA_WORKER_QUEUES=queue,
        EVORA_WORKER_CONCURRENCY="4",
        E2E_SIGNALS=str(signals),
    )
    doomed = await children.spawn("worker", evora_command("worker", "e2e_dependency_worker"), env)

    def hanging() -> bool:
        if not doomed.running:
            raise AssertionError(f"the worker exited:\n{doomed.output()}")
        return (signals / "hanging").exists()

    await stack.until(hanging, within=30, what="the worker process runs b")
    # C, released with B, may come in a later claim: once it completed, only B is in doubt.
    await stack.wait_for_states(queue, {"COMPLETED": 2, "RUNNING": 1, "WAITING": 1}, within=30)
    return doomed


def _counting_step(runs: Counter[str]) -> Handlers:
    """The diamond's handler for an in-process worker, counting its runs by job id."""
    handlers = Handlers()

    @handlers.job("step")
    async def step(job: Job) -> str:
        runs[job.id] += 1
        return str(job.payload["name"])

    return handlers


async def test_kill_9_of_a_worker_mid_run_changes_nothing_for_the_diamond(
    stack: Stack, store: JobStore, children: Children, tmp_path: Path
) -> None:
    """B's worker process dies holding B: the lease expires (the sweeper's statement), a
    second worker retries B, and D still starts once, after B and C completed."""
    queue = "e2e-diamond-kill"
    items = _diamond_with_a_hanging_b(queue, lease_seconds=2)
    _, b, c, d = (r.id for r in await stack.client.submit_batch(items))
    doomed = await _worker_process_hanging_in_b(stack, children, tmp_path, queue)
    doomed.send(signal.SIGKILL)
    await doomed.wait(within=10)
    assert (await stack.client.get(b))["state"] == "RUNNING"
    assert (await stack.client.get(d))["state"] == "WAITING"

    runs: Counter[str] = Counter()
    stack.start(stack.worker(_counting_step(runs), [queue], concurrency=4))

    async def all_completed() -> bool:
        await store.expire_leases()  # what the sweeper does
        return await stack.states(queue) == {"COMPLETED": 4}

    await stack.until(all_completed, within=60, what="every job completed")
    assert runs[b] == 1 and runs[d] == 1
    assert await stack.event_names(b) == [
        "submitted",
        "dependencies_met",
        "claimed",
        "lease_expired",
        "claimed",
        "completed",
    ]
    assert await stack.event_names(d) == ["submitted", "dependencies_met", "claimed", "completed"]
    events = {job: await stack.client.events(job) for job in (b, c, d)}
    started = _seq(events[d], "claimed")
    for branch in (b, c):
        assert _seq(events[branch], "completed") < started


async def test_kill_9_of_a_worker_and_the_sweeper_mid_run_changes_nothing_for_the_diamond(
    stack: Stack, children: Children, tmp_path: Path
) -> None:
    """A real `evora sweeper` process is SIGKILLed while B's lease is outstanding (B's worker
    process SIGKILLed too), and a new sweeper process expires that lease: B is retried and
    completes, and D runs once, claimed after every parent's completion was recorded."""
    queue = "e2e-diamond-sweeper-kill"
    first_port = free_port()
    first_sweeper = await spawn_service(children, stack.http, stack.db_url, "sweeper", first_port)

    async def sweeping() -> bool:
        samples = await scrape(stack.http, f"http://127.0.0.1:{first_port}")
        return samples[("evora_sweeper_active",)] == 1

    await stack.until(sweeping, within=30, what="the first sweeper holds the lock")
    items = _diamond_with_a_hanging_b(queue, lease_seconds=4)
    a, b, c, d = (r.id for r in await stack.client.submit_batch(items))
    doomed = await _worker_process_hanging_in_b(stack, children, tmp_path, queue)

    first_sweeper.send(signal.SIGKILL)
    await first_sweeper.wait(within=10)
    outstanding = await stack.pool.fetchval(
        "SELECT state = 'RUNNING' AND lease_expires_at > now() FROM evora.jobs WHERE id = $1::uuid",
        b,
    )
    assert outstanding, "b's lease ran out before the sweeper was killed"
    doomed.send(signal.SIGKILL)
    await doomed.wait(within=10)

    runs: Counter[str] = Counter()
    stack.start(stack.worker(_counting_step(runs), [queue], concurrency=4))
    port = free_port()
    second_sweeper = await spawn_service(children, stack.http, stack.db_url, "sweeper", port)
    await stack.wait_for_states(queue, {"COMPLETED": 4}, within=60)

    expired = await scrape(stack.http, f"http://127.0.0.1:{port}")
    assert expired[("evora_sweeper_leases_expired_total", "outcome=requeued")] == 1
    assert second_sweeper.running
    assert runs == Counter({b: 1, d: 1})  # a and c ran once in the killed process
    assert await stack.event_names(b) == [
        "submitted",
        "dependencies_met",
        "claimed",
        "lease_expired",
        "claimed",
        "completed",
    ]
    for job in (a, c, d):
        names = await stack.event_names(job)
        assert names[-2:] == ["claimed", "completed"] and names.count("claimed") == 1, names
    seqs = {
        (str(row["job_id"]), row["event"]): row["seq"]
        for row in await stack.pool.fetch(
            "SELECT job_id, event, seq FROM evora.job_events "
            "WHERE queue = $1 AND event IN ('claimed', 'completed')",
            queue,
        )
        if row["event"] == "completed" or row["job_id"] == UUID(d)
    }
    assert all(seqs[(d, "claimed")] > seqs[(parent, "completed")] for parent in (a, b, c))


async def test_workers_completing_parents_of_shared_children_never_deadlock(
    stack: Stack,
) -> None:
    """Several workers ack in batches, the dispatcher completes each batch in one statement
    on its own connection: racing batches end different parents of the same children. No
    transaction deadlocks (it would roll back an ack, answered 500, which the worker would
    retry), and every child runs once, after the last of its parents completed."""
    queue = "e2e-shared-children"
    rng = random.Random(16)
    handlers = Handlers()
    runs: Counter[str] = Counter()

    @handlers.job("parent")
    async def parent(job: Job) -> None:
        runs[job.id] += 1

    @handlers.job("child")
    async def child(job: Job) -> None:
        runs[job.id] += 1

    parents = [
        r.id for r in await stack.client.submit_batch([{"queue": queue, "type": "parent"}] * 96)
    ]
    children = await stack.client.submit_batch(
        [
            {"queue": queue, "type": "child", "depends_on": rng.sample(parents, 16)}
            for _ in range(64)
        ]
    )
    for _ in range(4):
        stack.start(stack.worker(handlers, [queue], concurrency=8, ack_batch_size=6))
    await stack.wait_for_states(queue, {"COMPLETED": 160}, within=60)

    answered = await scrape(stack.http, stack.dispatcher_url)
    failed = {
        sample: n
        for sample, n in answered.items()
        if sample[0] == "evora_http_requests_total" and n and "status=500" in sample
    }
    assert failed == {}
    assert set(runs.values()) == {1} and len(runs) == 160
    # ordered by seq, not `at` (see _seq)
    completed = {
        UUID(str(r["job_id"])): r["seq"]
        for r in await stack.pool.fetch(
            "SELECT job_id, seq FROM evora.job_events WHERE queue = $1 AND event = 'completed'",
            queue,
        )
    }
    for item in children:
        events = await stack.client.events(item.id)
        assert [e["event"] for e in events][:3] == ["submitted", "dependencies_met", "claimed"]
        claimed = events[2]["seq"]
        assert all(completed[UUID(p)] < claimed for p in item.job["depends_on"])
