"""A child ending while its parent is being made to wait for it (docs/jobs-that-wait.md,
"Children awaited without holding a slot"). A child a parent names may already run: an
idempotency key replays a job submitted before. evora.await_children() holds the children as
a submission holds its dependencies, so whichever transaction commits first, the other sees
it: the parent neither waits for ever for a child that ended unseen, nor resumes before its
children ended. Each held-transaction test keeps one side open at the unlucky moment; the
last test lets the two race with autocommit statements only."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.jobs import JobStore
from evora.storage.rows import JobDict
from tests.polling import waits_for_a_lock

KIDS = "kids"


async def running_child(store: JobStore, key: str) -> JobDict:
    """A child already submitted under `key` and claimed: a parent naming the key names it."""
    await store.submit(JobSubmission(queue=KIDS, type="c", idempotency_key=key))
    [child] = await store.claim(worker_id="w", queues=[KIDS])
    return child


async def running_parent(store: JobStore) -> JobDict:
    await store.submit(JobSubmission(queue="q", type="p"))
    [parent] = await store.claim(worker_id="w", queues=["q"])
    return parent


def child(key: str) -> JobSubmission:
    return JobSubmission(queue=KIDS, type="c", idempotency_key=key)


async def test_a_child_completing_while_its_parent_spawns_counts_as_ended(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """The child's completion holds its row, uncommitted, when the parent names it: the spawn
    waits for it and counts it as ended, so the parent waits only for the new child (read
    from the spawn's own snapshot, the child would still be RUNNING, and the parent would
    wait for it for ever: its completion's settlement saw no parent waiting)."""
    old = await running_child(store, "old")
    parent = await running_parent(store)
    async with pool.acquire() as worker:
        transaction = worker.transaction()
        await transaction.start()
        [completed] = await worker.fetch(
            queries.COMPLETE, [old["id"]], [old["lease_token"]], ["old result"], [], False
        )
        assert completed["outcome"] == "done"
        spawning = asyncio.create_task(
            store.spawn_children(parent["id"], parent["lease_token"], [child("old"), child("new")])
        )
        await waits_for_a_lock(pool)
        await transaction.commit()
    spawned = await spawning
    assert [c.created for c in spawned.children] == [False, True]
    assert spawned.job["state"] == "WAITING"
    left = "SELECT dependencies_left FROM evora.jobs WHERE id = $1"
    assert await pool.fetchval(left, parent["id"]) == 1
    [new] = await store.claim(worker_id="w", queues=[KIDS])
    await store.complete(new["id"], new["lease_token"], "new result")
    [again] = await store.claim(worker_id="w", queues=["q"])
    assert again["dependency_results"] == {
        str(old["id"]): "old result",
        str(new["id"]): "new result",
    }


async def test_a_child_completing_after_its_parent_spawned_releases_it(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """The spawn holds the child, uncommitted, when the child's worker completes it: the
    completion waits for the spawn, then its settlement sees the parent WAITING on it and
    releases it (completed first, the settlement would have found no parent waiting, and
    the spawn, counting the child RUNNING, would keep the parent WAITING for ever)."""
    old = await running_child(store, "old")
    parent = await running_parent(store)
    async with pool.acquire() as spawner:
        transaction = spawner.transaction()
        await transaction.start()
        [held] = await spawner.fetch(queries.HOLD_PARENT, parent["id"], parent["lease_token"])
        assert held["outcome"] == "done"
        [moved] = await spawner.fetch(queries.AWAIT_CHILDREN, parent["id"], [old["id"]], None, [])
        assert moved["job"]["state"] == "WAITING"
        completing = asyncio.create_task(store.complete(old["id"], old["lease_token"], "done"))
        await waits_for_a_lock(pool)
        await transaction.commit()
    assert (await completing)["state"] == "COMPLETED"
    now = await store.get(parent["id"])
    assert (now["state"], now["attempt"]) == ("PENDING", 0)
    events = [e["event"] for e in await store.events(parent["id"])]
    assert events == ["submitted", "claimed", "awaiting_children", "dependencies_met"]


async def test_children_ending_while_their_parents_spawn_never_strand_a_parent(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """The natural race, autocommit statements only: each parent names a running child by its
    key while the child's worker completes it. Whichever wins, the parent ends PENDING with
    nothing left to wait for, never WAITING on a finished child."""
    rounds = 20
    pairs = [
        (await running_child(store, f"k{n}"), await running_parent(store)) for n in range(rounds)
    ]
    tasks: list[Coroutine[Any, Any, object]] = []
    for n, (old, parent) in enumerate(pairs):
        tasks.append(store.complete(old["id"], old["lease_token"], "r"))
        tasks.append(store.spawn_children(parent["id"], parent["lease_token"], [child(f"k{n}")]))
    await asyncio.gather(*tasks)
    stranded = await pool.fetch(
        "SELECT p.id FROM evora.jobs p WHERE p.queue = 'q' AND p.state <> 'PENDING'"
    )
    assert stranded == []
    assert await pool.fetchval("SELECT sum(dependencies_left) FROM evora.jobs") == 0
