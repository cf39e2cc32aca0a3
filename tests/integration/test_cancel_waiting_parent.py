"""Cancelling a job that waits for its children (docs/jobs-that-wait.md, "Cancelling a
waiting job"): the children its spawns made are its work and are cancelled with it, each as
a cancel of its own would (at once, or by a request its worker acts on), theirs too; a child
its spawn only named (an idempotency key replaying someone else's job) runs on. A child
ending at the same moment is either ended first or cancelled, never stranded, and the two
never deadlock."""

from __future__ import annotations

import asyncio

import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.jobs import JobStore
from evora.storage.rows import JobDict
from tests.polling import waits_for_a_lock

KIDS = "kids"


def child(key: str, queue: str = KIDS) -> JobSubmission:
    return JobSubmission(queue=queue, type="c", idempotency_key=key)


async def running(store: JobStore, queue: str, key: str | None = None) -> JobDict:
    await store.submit(JobSubmission(queue=queue, type="p", idempotency_key=key))
    [job] = await store.claim(worker_id="w", queues=[queue])
    return job


async def states(pool: asyncpg.Pool, *ids: object) -> list[tuple[str, bool]]:
    rows = {
        r["id"]: (r["state"], r["cancel_requested"])
        for r in await pool.fetch(
            "SELECT id, state, cancel_requested FROM evora.jobs WHERE id = ANY($1::uuid[])",
            list(ids),
        )
    }
    return [rows[i] for i in ids]


async def test_cancelling_a_waiting_parent_cancels_the_children_it_made(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    # someone else's job, which the parent's spawn names by its idempotency key
    shared = (await store.submit(child("shared", "others"))).id
    parent = await running(store, "q")
    spawned = await store.spawn_children(
        parent["id"],
        parent["lease_token"],
        [child("shared", "others"), child("a"), child("b"), child("c")],
    )
    assert [c.created for c in spawned.children] == [False, True, True, True]
    a, b, c = (kid.id for kid in spawned.children[1:])
    claimed = {j["id"]: j for j in await store.claim(worker_id="w", queues=[KIDS], max_jobs=2)}
    assert set(claimed) == {a, b}
    # b waits for a child of its own; a runs
    grand = await store.spawn_children(b, claimed[b]["lease_token"], [child("g", "grand")])
    [g] = [kid.id for kid in grand.children]

    cancelled = await store.cancel(parent["id"])

    assert cancelled.immediate and cancelled.job["state"] == "CANCELLED"
    assert await states(pool, a, b, c, g) == [
        ("RUNNING", True),  # its worker is asked to stop, as by a cancel of its own
        ("CANCELLED", False),
        ("CANCELLED", False),
        ("CANCELLED", False),
    ]
    assert await states(pool, shared) == [("PENDING", False)]
    events = await pool.fetch(
        "SELECT job_id, event, from_state FROM evora.job_events"
        " WHERE job_id = ANY($1::uuid[]) AND event IN ('cancelled', 'cancel_requested')",
        [a, b, c, g],
    )
    assert {(e["job_id"], e["event"], e["from_state"]) for e in events} == {
        (a, "cancel_requested", "RUNNING"),
        (b, "cancelled", "WAITING"),
        (c, "cancelled", "PENDING"),
        (g, "cancelled", "PENDING"),
    }


async def test_a_child_another_job_waits_for_is_shared_and_runs_on(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """A child that a job outside the family also waits for is not only the parent's: it runs
    on. A child that only its siblings wait for is the family's and is cancelled."""
    parent = await running(store, "q")
    spawned = await store.spawn_children(
        parent["id"],
        parent["lease_token"],
        [
            child("wanted"),
            JobSubmission(queue=KIDS, type="c", ref="first"),
            JobSubmission(queue=KIDS, type="c", depends_on=["ref:first"]),
        ],
    )
    wanted, first, second = (kid.id for kid in spawned.children)
    # someone else submits a job that waits for one of the children
    outsider = (await store.submit(JobSubmission(queue="others", type="o", depends_on=[wanted]))).id

    assert (await store.cancel(parent["id"])).immediate

    assert await states(pool, wanted, outsider, first, second) == [
        ("PENDING", False),
        ("WAITING", False),
        ("CANCELLED", False),
        ("CANCELLED", False),
    ]


async def test_a_child_completing_while_its_parent_is_cancelled(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """The child's completion holds its row (and, settling, its parent's), uncommitted, when
    the parent is cancelled: the cancel waits for it, then cancels the parent and the other
    child. The completion stands; nothing is left waiting or running for a parent that is
    gone."""
    parent = await running(store, "q")
    spawned = await store.spawn_children(
        parent["id"], parent["lease_token"], [child("x"), child("y")]
    )
    x, y = (kid.id for kid in spawned.children)
    [claimed] = await store.claim(worker_id="w", queues=[KIDS])
    assert claimed["id"] == x
    async with pool.acquire() as worker:
        transaction = worker.transaction()
        await transaction.start()
        [completed] = await worker.fetch(
            queries.COMPLETE, [x], [claimed["lease_token"]], ["x result"], [], False
        )
        assert completed["outcome"] == "done"
        cancelling = asyncio.create_task(store.cancel(parent["id"]))
        await waits_for_a_lock(pool)
        await transaction.commit()
    cancelled = await cancelling
    assert cancelled.immediate
    assert await states(pool, parent["id"], x, y) == [
        ("CANCELLED", False),
        ("COMPLETED", False),
        ("CANCELLED", False),
    ]


async def test_children_ending_while_their_parents_are_cancelled_never_deadlock(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """A natural race, autocommit statements only: workers complete the children of ten
    parents while the parents are cancelled. Each cancel succeeds (no deadlock), and every
    child ends completed or cancelled, or runs with its cancel requested."""
    parents = []
    for n in range(10):
        parent = await running(store, "q", key=f"p{n}")
        await store.spawn_children(
            parent["id"], parent["lease_token"], [child(f"p{n}-{k}") for k in range(3)]
        )
        parents.append(parent["id"])
    claimed = await store.claim(worker_id="w", queues=[KIDS], max_jobs=30)

    async def complete(job: JobDict) -> None:
        await store.complete(job["id"], job["lease_token"], "done")

    results = await asyncio.gather(
        *(complete(job) for job in claimed),
        *(store.cancel(p) for p in parents),
        return_exceptions=True,
    )
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert {s for s, _ in await states(pool, *parents)} == {"CANCELLED"}
    kids = await pool.fetch("SELECT state FROM evora.jobs WHERE queue = $1", KIDS)
    assert len(kids) == 30
    assert {k["state"] for k in kids} <= {"COMPLETED", "CANCELLED"}
