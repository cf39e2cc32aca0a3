"""Cancelling a job that waits for its children (docs/jobs-that-wait.md, "Cancelling a
waiting job"): the children its spawns made are its work and are cancelled with it, each as
a cancel of its own would (at once, or by a request its worker acts on), theirs too; a child
its spawn only named (an idempotency key replaying someone else's job) runs on. A child
ending at the same moment is either ended first or cancelled, never stranded, and the two
never deadlock."""

from __future__ import annotations

import asyncio
import json
from typing import Literal
from uuid import UUID

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.db import jsonb_elements
from evora.storage.jobs import Completion, JobStore
from evora.storage.rows import JobDict
from tests.integration.test_submission_cost import node_work
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


# After every row a cancel moves, the length of the setting each note of an ended dependency
# appends its id to (functions/dependencies.sql): what the next note copies. (pg_settings
# leaves such placeholder settings out, so it is read by name.) A row's AFTER triggers fire
# in name order, so this one runs after jobs_note_ended_dependency.
_NOTED_LENGTH = """
CREATE TABLE noted_length (bytes integer);
CREATE FUNCTION noted_length() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO noted_length
    VALUES (octet_length(current_setting('evora.ended_dependencies', true)));
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_zz_noted_length AFTER UPDATE OF state ON evora.jobs
    FOR EACH ROW WHEN (NEW.state = 'CANCELLED') EXECUTE FUNCTION noted_length();
"""


async def test_what_noting_an_ended_dependency_copies_does_not_grow_with_the_statement(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """A statement that ends many jobs others wait on (here a cancel of a parent and its
    children, each of which the parent waits for) notes each for its settlement in settings
    local to the transaction, and a note copies the setting it writes. When one setting held
    every id, the n-th note copied n ids: a statement ending n such jobs did O(n^2) work
    (`python -m bench.cancel_fanout`). Counted here without timing: the noted ids a note
    copies are no more in a cancel of 2,500 children than in a cancel of 500."""
    await pool.execute(_NOTED_LENGTH)
    longest = []
    for size in (500, 2_500):
        parent = await running(store, "q", key=f"parent of {size}")
        await store.spawn_children(
            parent["id"], parent["lease_token"], [child(f"{size}-{k}") for k in range(size)]
        )
        assert (await store.cancel(parent["id"])).immediate
        longest.append(await pool.fetchval("SELECT max(bytes) FROM noted_length"))
        await pool.execute("TRUNCATE noted_length")
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM evora.jobs WHERE queue = $1 AND state = 'CANCELLED'", KIDS
        )
        == 3_000
    )
    # the probe saw the notes (a statement of 500 notes 500 ids, 37 bytes each)
    assert longest[0] > 0
    assert longest[1] <= longest[0], f"the noted ids, bytes at most: {longest}"


# The settings of the notes: the one a note appends to, the count of the full ones moved
# aside, and the 4th and 5th of those (222 ids fill one).
_NOTE_SETTINGS = (
    "SELECT current_setting('evora.ended_dependencies', true) AS noted,"
    " current_setting('evora.ended_dependency_chunks', true) AS chunks,"
    " current_setting('evora.ended_dependencies_4', true) AS fourth,"
    " current_setting('evora.ended_dependencies_5', true) AS fifth"
)


async def test_a_pooled_connection_keeps_the_notes_its_largest_statement_needed_emptied(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """The notes live in settings local to the transaction: a connection keeps the settings
    its largest statement created (empty between transactions), not more with every
    transaction. Three cancels of 1,000 children on one connection each fill four settings
    of 222 ids, and the fifth never exists."""
    async with pool.acquire() as conn:
        for n in range(3):
            parent = await running(store, "q", key=f"parent {n}")
            await store.spawn_children(
                parent["id"], parent["lease_token"], [child(f"{n}-{k}") for k in range(1_000)]
            )
            [cancelled] = await conn.fetch(queries.CANCEL, parent["id"], [])
            assert cancelled["outcome"] == "done"
            assert dict(await conn.fetchrow(_NOTE_SETTINGS)) == {
                "noted": "",
                "chunks": "",
                "fourth": "",
                "fifth": None,
            }
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM evora.jobs WHERE queue = $1 AND state = 'CANCELLED'", KIDS
        )
        == 3_000
    )


@pytest.mark.parametrize("ack", ["held", "racing"])
async def test_a_cancel_of_thousands_of_children_and_an_ack_batch_settle_the_same_waiting_jobs(
    store: JobStore, pool: asyncpg.Pool, ack: str
) -> None:
    """Two statements on two connections end many dependencies of the same WAITING jobs: the
    cancel of a parent and its 3,000 children (each waiter waits for the parent), and an ack
    batch completing the other 100 jobs each waiter waits for. Both lock the waiters in one
    id order, so neither deadlocks, and each settles them with what the other committed:
    every waiter moves once, "run" ones to PENDING and "cancel" ones to CANCELLED by the
    parent. `held`: the ack batch has settled (each waiter left with the parent to wait for)
    and stays open while the cancel reaches the waiters; `racing`: autocommit, any order."""
    parent = await running(store, "q")
    await store.spawn_children(
        parent["id"], parent["lease_token"], [child(f"kid-{k}") for k in range(3_000)]
    )
    acked = [s.id for s in await store.submit_batch([JobSubmission(queue="acked", type="a")] * 100)]
    waiters: dict[UUID, str] = {}
    for n in range(20):
        on_failure: Literal["run", "cancel"] = "cancel" if n % 2 else "run"
        submission = JobSubmission(
            queue="waiters",
            type="w",
            depends_on=[parent["id"], *acked],
            on_dependency_failure=on_failure,
        )
        waiters[(await store.submit(submission)).id] = on_failure
    claimed = await store.claim(worker_id="w", queues=["acked"], max_jobs=100)
    assert len(claimed) == 100
    ids = [j["id"] for j in claimed]
    tokens = [j["lease_token"] for j in claimed]
    results = jsonb_elements([None] * len(ids))

    if ack == "held":
        async with pool.acquire() as worker:
            transaction = worker.transaction()
            await transaction.start()
            completed = await worker.fetch(queries.COMPLETE, ids, tokens, results, [], False)
            assert {r["outcome"] for r in completed} == {"done"}
            assert (
                await pool.fetchval(
                    "SELECT count(*) FROM evora.jobs WHERE queue = 'waiters' AND state = 'WAITING'"
                )
                == 20
            )
            cancelling = asyncio.create_task(store.cancel(parent["id"]))
            await waits_for_a_lock(pool)
            await transaction.commit()
        assert (await cancelling).immediate
    else:
        outcomes = await asyncio.gather(
            store.complete_many([Completion(i, t) for i, t in zip(ids, tokens, strict=True)]),
            store.cancel(parent["id"]),
            return_exceptions=True,
        )
        assert [o for o in outcomes if isinstance(o, BaseException)] == []

    rows = await pool.fetch(
        "SELECT job_id, event, from_state::text, to_state::text, data->>'dependency' AS cause"
        " FROM evora.job_events WHERE queue = 'waiters' ORDER BY seq"
    )
    events: dict[UUID, list[tuple[str, str | None, str, str | None]]] = {w: [] for w in waiters}
    for r in rows:
        events[r["job_id"]].append((r["event"], r["from_state"], r["to_state"], r["cause"]))
    for waiter, failure_rule in waiters.items():
        settled = (
            ("dependencies_met", "WAITING", "PENDING", None)
            if failure_rule == "run"
            else ("cancelled", "WAITING", "CANCELLED", str(parent["id"]))
        )
        assert events[waiter] == [("submitted", None, "WAITING", None), settled]
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM evora.jobs WHERE queue = 'waiters' AND dependencies_left = 0"
            " AND state = 'PENDING'"
        )
        == 10
    )
    kids = await pool.fetch(
        "SELECT j.state::text, count(e.*) AS events FROM evora.jobs j"
        " JOIN evora.job_events e ON e.job_id = j.id AND e.event = 'cancelled'"
        " WHERE j.queue = $1 GROUP BY j.id",
        KIDS,
    )
    assert len(kids) == 3_000
    assert {(k["state"], k["events"]) for k in kids} == {("CANCELLED", 1)}
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM evora.jobs WHERE queue = 'acked' AND state = 'COMPLETED'"
        )
        == 100
    )


# Rows the tree's plan may produce or discard per child: an index probe of the children of
# each job in the tree, each child's check for another waiting job and its row.
TREE_WORK_PER_CHILD_BOUND = 20


def siblings(size: int, chained: bool) -> list[JobSubmission]:
    """A spawn's children, each after the first waiting for the one before it if `chained`."""
    return [
        JobSubmission(
            queue=KIDS,
            type="c",
            ref=f"{size}-{k}",
            depends_on=[f"ref:{size}-{k - 1}"] if chained and k else [],
        )
        for k in range(size)
    ]


@pytest.mark.parametrize("chained", [False, True], ids=["independent", "chained"])
async def test_the_tree_a_cancel_reads_costs_its_children_not_their_square(
    store: JobStore, pool: asyncpg.Pool, chained: bool
) -> None:
    """A cancel reads the tree of its job's spawned children twice (evora.spawned_tree()).
    Once the tables are analysed, as autovacuum soon has them, all the children of a spawn
    share one parent in `spawned_children`, and the planner may join each level of the tree
    to the whole table materialised, comparing every child with every child (20,000 children
    took 72 s a read). `chained`: each child but the last is waited for by a sibling, so
    each is checked against the family (a job of the family waiting for a child does not
    make it shared); reading the whole family for each such child, the check was the square
    of the children too (1,000 rows per child of 1,000, 3,000 of 3,000). Counted from the
    analysed plan, without timing: the rows it produces or discards per child stay under a
    bound, for 1,000 children as for 3,000. (Smaller tables are read whole where a probe
    would cost more.)"""
    work = []
    for size in (1_000, 3_000):
        parent = await running(store, "q", key=f"parent of {size}")
        await store.spawn_children(parent["id"], parent["lease_token"], siblings(size, chained))
        await pool.execute("ANALYZE evora.spawned_children, evora.jobs, evora.job_dependencies")
        [row] = await pool.fetch(
            "EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) SELECT * FROM evora.spawned_tree($1)",
            parent["id"],
        )
        [explained] = json.loads(row[0]) if isinstance(row[0], str) else row[0]
        assert explained["Plan"]["Actual Rows"] == size
        work.append(node_work(explained["Plan"]) / size)
    assert max(work) <= TREE_WORK_PER_CHILD_BOUND, f"rows per child: {work}"
