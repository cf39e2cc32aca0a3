"""Evora's own transitions take their row locks in one order, so no two of them can wait for
each other (docs/lock-order.md lists each pair and why it cannot cycle).

Each cycle found is built here at its unlucky moment, not waited for: a test trigger holds a
statement after it locked its first rows (or held transactions keep it waiting), and the
other party is started against it. Before their fixes, the first four tests failed with
DeadlockDetectedError (PostgreSQL's detector fails one of the two after deadlock_timeout);
the last keeps a pair that the first order tried for cancels (deepest first) broke.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from uuid import UUID

import asyncpg
import pytest

from evora.domain.errors import InvalidState
from evora.protocol.jobs import JobSubmission
from evora.storage import queries, submissions
from evora.storage.jobs import AckResult, Completion, Failure, JobStore
from evora.storage.limits import LimitSpec, LimitStore
from tests.gate import gate_on, held, hold, open_gate
from tests.integration.test_cancel_waiting_parent import child, running, states
from tests.polling import until, waits_for_a_lock


@pytest.fixture
async def gate(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Pool]:
    async with gate_on(pool):
        yield pool


async def _hold_updates(pool: asyncpg.Pool, held_when: str) -> None:
    await hold(pool, "evora.jobs", "UPDATE", held_when)


async def _both_blocked(pool: asyncpg.Pool, *, not_by: int = 0) -> bool:
    """Whether two statements wait for a lock that a transaction other than that of the
    backend `not_by` holds, or waits for ahead of them."""
    count: int = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND cardinality(pg_blocking_pids(pid)) > 0"
        " AND NOT $1 = ANY(pg_blocking_pids(pid))",
        not_by,
    )
    return count == 2


async def _complete_while_a_cancel_waits(
    store: JobStore, gate: asyncpg.Pool, queue: str, job_id: UUID, token: UUID, cancelled: UUID
) -> None:
    """The completion of `job_id` (of `queue`) held at the gate, its row locked, while a cancel
    of `cancelled` starts and waits for a lock; then both go on, and both must succeed."""
    await _hold_updates(gate, f"OLD.queue = '{queue}' AND NEW.state = 'COMPLETED'")
    completing = asyncio.create_task(store.complete(job_id, token, "done"))
    await until(lambda: held(gate), "the completion holds its row")
    cancelling = asyncio.create_task(store.cancel(cancelled))
    await waits_for_a_lock(gate)

    await open_gate(gate)
    completed, cancel = await asyncio.wait_for(asyncio.gather(completing, cancelling), 30)
    assert completed["state"] == "COMPLETED"
    assert cancel.immediate


async def test_a_cancel_and_a_grandchild_ending_lock_the_child_in_one_order(
    store: JobStore, gate: asyncpg.Pool
) -> None:
    """A job's completion settles its waiting dependents after it holds the job: a
    grandchild's completion holds the grandchild, then locks the child that waits for it. A
    cancel of the grandparent locks its whole tree; in id order it took the child (older,
    the smaller id) first and then waited for the grandchild, while the completion waited for
    the child: a deadlock. The jobs that are not WAITING are locked before the WAITING ones
    (evora.hold_spawned_tree()), so the cancel waits for the grandchild before it holds the
    child, and both go on."""
    parent = await running(store, "q")
    [kid] = (await store.spawn_children(parent["id"], parent["lease_token"], [child("c")])).children
    [claimed_kid] = await store.claim(worker_id="w", queues=["kids"])
    [grandkid] = (
        await store.spawn_children(kid.id, claimed_kid["lease_token"], [child("g", "grand")])
    ).children
    [claimed_grandkid] = await store.claim(worker_id="w", queues=["grand"])
    # the order that made the cycle: id order takes the child first
    assert kid.id < grandkid.id

    await _complete_while_a_cancel_waits(
        store, gate, "grand", grandkid.id, claimed_grandkid["lease_token"], parent["id"]
    )
    # the completion released the child (PENDING), and the cancel then cancelled it
    assert await states(gate, parent["id"], kid.id, grandkid.id) == [
        ("CANCELLED", False),
        ("CANCELLED", False),
        ("COMPLETED", False),
    ]


async def test_a_cancel_and_a_sibling_ending_lock_the_sibling_waiting_for_it_in_one_order(
    store: JobStore, gate: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Children of one spawn may wait for each other (`ref:`): the later one waits for the
    earlier, and the earlier one's completion holds it and then locks the later one. The later
    child's id may be the smaller (a batch's ids follow its items' order only since migration
    0068; a release before drew them at random within their millisecond): in id order, a
    cancel of their parent held the waiting sibling and waited for the one completing, which
    waited for it. The WAITING jobs are locked last. The ids are drawn in that unlucky order
    here, not waited for."""
    drawn = submissions.uuid7s

    def descending(count: int) -> list[UUID]:
        return sorted(drawn(count), reverse=True)

    parent = await running(store, "q")
    monkeypatch.setattr(submissions, "uuid7s", descending)
    first, then = (
        await store.spawn_children(
            parent["id"],
            parent["lease_token"],
            [
                JobSubmission(queue="kids", type="c", ref="first"),
                JobSubmission(queue="kids", type="c", depends_on=["ref:first"]),
            ],
        )
    ).children
    monkeypatch.undo()
    assert then.id < first.id
    [claimed] = await store.claim(worker_id="w", queues=["kids"])
    assert claimed["id"] == first.id  # `then` waits for it

    await _complete_while_a_cancel_waits(
        store, gate, "kids", first.id, claimed["lease_token"], parent["id"]
    )
    assert await states(gate, parent["id"], first.id, then.id) == [
        ("CANCELLED", False),
        ("COMPLETED", False),
        ("CANCELLED", False),
    ]


async def test_cancels_of_a_job_and_of_its_child_lock_the_grandchildren_in_one_order(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """An admin cancels a job while another cancels one of its children: each locks its own
    tree, the child's tree inside the job's. In id order the job's cancel took the child
    (older than its children) before the grandchildren, and the child's cancel took the
    grandchildren before the child: each held what the other waited for. Built with two
    held transactions that keep each cancel waiting at its first lock: a completion of a
    grandchild (which holds it and, settling, the child) and a heartbeat of the other
    grandchild. Both cancels now take the running grandchildren before the waiting child,
    and the job with them: the child's cancel waits behind the job's and then finds the
    child cancelled."""
    parent = await running(store, "q")
    [kid] = (await store.spawn_children(parent["id"], parent["lease_token"], [child("c")])).children
    [claimed_kid] = await store.claim(worker_id="w", queues=["kids"])
    grandkids = (
        await store.spawn_children(
            kid.id, claimed_kid["lease_token"], [child("g1", "grand"), child("g2", "grand")]
        )
    ).children
    tokens = {
        j["id"]: j["lease_token"]
        for j in await store.claim(worker_id="w", queues=["grand"], max_jobs=2)
    }
    low, high = sorted(g.id for g in grandkids)
    # the order that made the cycle: the child first, then the grandchildren
    assert kid.id < low

    async with pool.acquire() as completer, pool.acquire() as beater:
        completion = completer.transaction()
        await completion.start()
        completer_pid: int = await completer.fetchval("SELECT pg_backend_pid()")
        [completed] = await completer.fetch(
            queries.COMPLETE, [high], [tokens[high]], ["done"], [], False
        )
        assert completed["outcome"] == "done"
        heartbeat = beater.transaction()
        await heartbeat.start()
        [beat] = await beater.fetch(queries.HEARTBEAT, low, tokens[low], None, None)
        assert beat["outcome"] == "done"

        cancelling_parent = asyncio.create_task(store.cancel(parent["id"]))
        await waits_for_a_lock(pool)
        cancelling_kid = asyncio.create_task(store.cancel(kid.id))
        await until(lambda: _both_blocked(pool), "both cancels wait")
        await completion.commit()
        # each cancel waits for the heartbeat, or for the other cancel
        await until(
            lambda: _both_blocked(pool, not_by=completer_pid),
            "both cancels wait, neither for the completion",
        )
        await heartbeat.commit()
        outcomes = await asyncio.wait_for(
            asyncio.gather(cancelling_parent, cancelling_kid, return_exceptions=True), 30
        )

    cancelled, refused = outcomes
    assert not isinstance(cancelled, BaseException) and cancelled.immediate
    assert isinstance(refused, InvalidState), refused  # the child was cancelled with its parent
    assert await states(pool, parent["id"], kid.id, low, high) == [
        ("CANCELLED", False),
        ("CANCELLED", False),
        ("RUNNING", True),  # its worker is asked to stop
        ("COMPLETED", False),
    ]


async def test_a_prefix_limit_deleted_while_an_upstream_drains_two_of_its_keys(
    store: JobStore, gate: asyncpg.Pool
) -> None:
    """Deleting a prefix limit deletes the buckets of the keys under it; a batch of failures
    reporting an upstream's retry-after drains its keys' buckets in key order
    (evora.drain_buckets()). The delete took the buckets in the order its scan met them: here
    `tenant:b` (made first) before `tenant:a`, while the drain held `tenant:a` and waited for
    `tenant:b`: a deadlock. The delete locks the buckets in key order first."""
    limits = LimitStore(gate)
    await limits.put("tenant:*", LimitSpec(concurrency=5, rate=None))
    claimed = {}
    for key in ("tenant:b", "tenant:a"):  # each claim makes its key's bucket
        await store.submit(JobSubmission(queue="upstream", type="u", limit_keys=[key]))
        [claimed[key]] = await store.claim(worker_id="w", queues=["upstream"])
    assert [r["key"] for r in await gate.fetch("SELECT key FROM evora.flow_buckets")][:2] == [
        "tenant:b",
        "tenant:a",
    ]

    await hold(gate, "evora.flow_buckets", "DELETE", "OLD.key = 'tenant:b'")
    deleting = asyncio.create_task(limits.delete("tenant:*"))
    await until(lambda: held(gate), "the delete holds a bucket")
    failing = asyncio.create_task(
        store.fail_many(
            [
                Failure(
                    job["id"], job["lease_token"], "429", retry_in_seconds=60, retry_after_key=key
                )
                for key, job in sorted(claimed.items(), reverse=True)
            ]
        )
    )
    await waits_for_a_lock(gate)

    await open_gate(gate)
    _, failed = await asyncio.wait_for(asyncio.gather(deleting, failing), 30)

    assert [o.result for o in failed] == [AckResult.DONE, AckResult.DONE]
    assert await gate.fetchval("SELECT count(*) FROM evora.flow_limits") == 0


async def test_a_cancel_and_an_ack_batch_of_two_depths_lock_the_running_jobs_by_id(
    store: JobStore, gate: asyncpg.Pool
) -> None:
    """A worker's batch of acks may hold a child and a cousin's child (a grandchild), both
    RUNNING, and locks them by id: the child (older) first. The tree's cancel must take them
    in the same order, and so it does not lock deepest first (a grandchild before a child),
    the first order tried for the cycles above: that cancel held the grandchild and waited
    for the child while the batch, holding the child, waited for the grandchild. Held here
    after the batch locked the child."""
    parent = await running(store, "q")
    kids = (
        await store.spawn_children(parent["id"], parent["lease_token"], [child("a"), child("b")])
    ).children
    tokens = {
        j["id"]: j["lease_token"]
        for j in await store.claim(worker_id="w", queues=["kids"], max_jobs=2)
    }
    running_kid, spawning_kid = sorted(k.id for k in kids)
    [grandkid] = (
        await store.spawn_children(spawning_kid, tokens[spawning_kid], [child("g", "grand")])
    ).children
    [claimed_grandkid] = await store.claim(worker_id="w", queues=["grand"])
    assert running_kid < grandkid.id

    await _hold_updates(gate, "OLD.queue = 'kids' AND NEW.state = 'COMPLETED'")
    acking = asyncio.create_task(
        store.complete_many(
            [
                Completion(running_kid, tokens[running_kid]),
                Completion(grandkid.id, claimed_grandkid["lease_token"]),
            ]
        )
    )
    await until(lambda: held(gate), "the batch holds the child")
    cancelling = asyncio.create_task(store.cancel(parent["id"]))
    await waits_for_a_lock(gate)

    await open_gate(gate)
    acked, cancelled = await asyncio.wait_for(asyncio.gather(acking, cancelling), 30)

    assert [o.result for o in acked] == [AckResult.DONE, AckResult.DONE]
    assert cancelled.immediate
    assert await states(gate, parent["id"], running_kid, spawning_kid, grandkid.id) == [
        ("CANCELLED", False),
        ("COMPLETED", False),
        ("CANCELLED", False),  # released by its child's completion, then cancelled
        ("COMPLETED", False),
    ]
