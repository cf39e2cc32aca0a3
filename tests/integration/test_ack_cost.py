"""An ack's cost follows its own items, not how many jobs run elsewhere.

A completion or failure finds each job by its id, fenced by the item's token and the state the
job must be in. If the planner reads the fence's `state = 'RUNNING'` as a filter on `jobs`, it
may instead scan every RUNNING job of every queue (through an index on state) and hash-join
the items to them: with the default estimate for `state`, which has no statistics, a scan of
"a few hundred" rows looks cheaper than one index probe per item. (With no such filter, a
table small enough would rightly be read whole; a queue's backlog makes it too big for that.)
The count of rows read is exact (the transaction's own `pg_stat_xact_user_tables`), so the
bound below involves no timing."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.db import create_pool, jsonb_elements
from evora.storage.jobs import JobStore

ELSEWHERE = 3_000  # jobs RUNNING under other workers, in another queue
BACKLOG = 20_000  # jobs waiting in a third queue: a table too big to read whole for one ack
ITEMS = 50
# Per acked item: one probe of the primary key for the change, a re-read for its answer, the
# index entries the new row versions and events check; far below ELSEWHERE / ITEMS = 60.
ROWS_READ_PER_ITEM = 12

Arguments = Callable[[list[object], list[object]], tuple[object, ...]]


async def rows_read(conn: asyncpg.Connection) -> int:
    read: int = await conn.fetchval(
        "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) "
        "FROM pg_stat_xact_user_tables WHERE relname = 'jobs'"
    )
    return read


def complete_args(ids: list[object], tokens: list[object]) -> tuple[object, ...]:
    return (ids, tokens, jsonb_elements(None for _ in ids), [], False)


def fail_args(ids: list[object], tokens: list[object]) -> tuple[object, ...]:
    errors = [{"message": "boom", "type": None} for _ in ids]
    return (ids, tokens, errors, [True] * len(ids), [None] * len(ids), [None] * len(ids), [], False)


# asyncpg prepares every statement, and from its sixth run PostgreSQL may keep a generic plan,
# made without the parameters' values: both kinds of plan must probe per item.
PLANS = ("auto", "force_generic_plan")
STATEMENTS = {"complete": (queries.COMPLETE, complete_args), "fail": (queries.FAIL, fail_args)}


async def test_an_ack_reads_rows_for_its_items_not_for_every_running_job(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    # one table for every case: filling it is most of this test's time (ids asked for only:
    # decoding its 23,000 jobs cost ~2 of this test's ~5 CPU s)
    for _ in range(BACKLOG // 1000):
        await store.submit_batch(
            [JobSubmission(queue="backlog", type="t") for _ in range(1000)], with_jobs=False
        )
    for _ in range(ELSEWHERE // 1000):
        await store.submit_batch(
            [JobSubmission(queue="busy", type="t") for _ in range(1000)], with_jobs=False
        )
        assert len(await store.claim(worker_id="others", queues=["busy"], max_jobs=1000)) == 1000
    cases = [(name, plans) for name in STATEMENTS for plans in PLANS]
    await store.submit_batch(
        [JobSubmission(queue="mine", type="t") for _ in range(ITEMS * len(cases))]
    )
    read: dict[tuple[str, str], int] = {}
    async with pool.acquire() as conn:
        await conn.execute("ANALYZE evora.jobs")
        for name, plans in cases:
            statement, args = STATEMENTS[name]
            mine = await store.claim(worker_id="me", queues=["mine"], max_jobs=ITEMS)
            assert len(mine) == ITEMS
            await conn.execute(f"SET plan_cache_mode = {plans}")
            async with conn.transaction():
                before = await rows_read(conn)
                rows = await conn.fetch(
                    statement, *args([j["id"] for j in mine], [j["lease_token"] for j in mine])
                )
                read[name, plans] = await rows_read(conn) - before
            assert [r["outcome"] for r in rows] == ["done"] * ITEMS
    assert all(n <= ITEMS * ROWS_READ_PER_ITEM for n in read.values()), (
        f"rows of jobs read to ack {ITEMS} items: {read}"
    )


async def test_a_completion_reads_each_job_once_and_records_in_its_own_statement(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """What a completion does per item beyond what it must (docs/benchmarks/
    2026-11-29-postgresql-cpu-profile.md): each item's job is read once, by the update that
    completes it, and its event is written by the completion's own statement. The item's
    second read, looking for a job that the update already moved, cost a primary-key probe
    and a fetch of the whole row per item; recording through evora.record_moves() cost a
    PL/pgSQL call, a statement of its own, and each moved job copied into a composite and
    read back out of it. PL/pgSQL calls are counted (`track_functions = 'pl'`, this
    transaction's own statistics): the completion's function, the statement trigger that
    settles dependents (it finds nothing here), and the function of the batches' index of
    job times (migration 0066) for the statement's one batch row, once each; nothing per
    item, nothing else."""
    await store.submit_batch([JobSubmission(queue="mine", type="t") for _ in range(ITEMS)])
    mine = await store.claim(worker_id="me", queues=["mine"], max_jobs=ITEMS)
    ids = [j["id"] for j in mine]
    async with pool.acquire() as conn:
        await conn.execute("ANALYZE evora.jobs")
        await conn.execute("SET track_functions = 'pl'")
        async with conn.transaction():
            before = await rows_read(conn)
            rows = await conn.fetch(
                queries.COMPLETE, *complete_args(ids, [j["lease_token"] for j in mine])
            )
            read = await rows_read(conn) - before
            called = {
                r["funcname"]: r["calls"]
                for r in await conn.fetch(
                    "SELECT funcname, calls FROM pg_stat_xact_user_functions"
                    " WHERE schemaname = 'evora'"
                )
            }
        events = await conn.fetchval(
            "SELECT count(*) FROM evora.job_events WHERE job_id = ANY($1::uuid[])"
            " AND event = 'completed' AND to_state = 'COMPLETED'",
            ids,
        )
    assert [r["outcome"] for r in rows] == ["done"] * ITEMS
    assert events == ITEMS
    assert called == {"complete_items": 1, "settle_dependents": 1, "job_id_times": 1}, called
    assert read <= ITEMS, f"rows of jobs read to complete {ITEMS} items: {read}"


FINISHED = 300  # finished jobs still in `jobs`, as retention keeps them for a while
# A plan that reads the table reads every finished job: 300 keep it 25x above the bound
# (1,000 before, most of the test's time). At 300, evora.complete_items() finding its jobs by the
# join alone (no `j.id = ANY(ids)`, default random_page_cost) read 303-607 rows (PostgreSQL
# 18, 2026-11-30).


async def test_a_completion_finds_its_job_by_primary_key_however_many_finished_jobs_remain(
    store: JobStore, db_url: str
) -> None:
    """A connection keeps a generic plan once made (the dispatcher's are all generic). Made
    while `jobs` was small, a sequential scan of it hashed against the items (an array
    parameter, taken for 10 elements) looked cheaper than probing the primary key, and every
    later completion on that connection read the whole table, finished jobs too. Both kinds
    of plan must read the completed rows only, whatever the table held when they were made."""
    read: dict[str, list[int]] = {}
    for plans in PLANS:
        # as a dispatcher's connection: it completes a drained backlog, then one job at a time
        one = await create_pool(
            db_url, min_size=1, max_size=1, generic_plans=plans == "force_generic_plan"
        )
        conn = await one.acquire()
        try:
            await store.submit_batch(
                [JobSubmission(queue="done", type="t") for _ in range(FINISHED)]
            )
            while taken := await store.claim(worker_id="w", queues=["done"], max_jobs=100):
                await conn.fetch(
                    queries.COMPLETE,
                    *complete_args([j["id"] for j in taken], [j["lease_token"] for j in taken]),
                )
            for _ in range(3):
                await store.submit_batch([JobSubmission(queue="q", type="t")])
                [job] = await store.claim(worker_id="me", queues=["q"], max_jobs=1)
                async with conn.transaction():
                    before = await rows_read(conn)
                    [row] = await conn.fetch(
                        queries.COMPLETE, *complete_args([job["id"]], [job["lease_token"]])
                    )
                    after = await rows_read(conn)
                assert row["outcome"] == "done"
                read.setdefault(plans, []).append(after - before)
        finally:
            await one.release(conn)
            await one.close()
    print(f"rows of jobs read to complete 1 job beside {FINISHED} finished ones: {read}")
    assert all(rows <= ROWS_READ_PER_ITEM for per in read.values() for rows in per), read
