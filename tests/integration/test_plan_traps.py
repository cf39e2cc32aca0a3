"""No statement the services run often reads `jobs` whole, whatever plan its connection keeps.

A connection plans each statement (and each statement inside a PL/pgSQL function) once and
may keep that plan for as long as it lives: a generic plan, made without the parameters'
values, once plan_cache_mode or the plan cache's own choice says so. A plan made while `jobs`
was small can be one that only a small table makes cheap: a sequential scan hashed against
the job ids the statement was given (the planner takes an array parameter for 10 elements,
and on a table of a few pages one pass is cheaper than 10 probes of the primary key), or a
walk of a partial index of every RUNNING job filtered by id. Made at startup and kept, such a
plan reads every job still in the table, finished ones too, on every later failure, release,
cancel or heartbeat. Here each operation runs through the store on one connection (as a
service's) a few times while the table holds a handful of jobs, so that its plans are made
then, under the plan cache's own choice (auto) and under force_generic_plan (the
dispatcher's, db.session_settings), each on a database of its own; then the table gets
FINISHED finished jobs and RUNNING jobs of other workers, and what the operation reads is
counted exactly (the transaction's own pg_stat_xact_user_tables), so the bound below
involves no timing. The small table has never been vacuumed, as on a new installation before
autovacuum's first visit: the planner takes it for 10 pages. One that a VACUUM or ANALYZE
recorded as a single page makes every lookup by id a sequential scan until the next ANALYZE
(docs/deploy.md, Plans): not held here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from uuid import uuid4

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.db import create_pool
from evora.storage.jobs import Completion, Failure, JobStore
from evora.storage.limits import LimitSpec, LimitStore
from tests.conftest import MakeDatabase

FINISHED = 300  # finished jobs still in `jobs`, as retention keeps them for a while
RUNNING = 100  # jobs RUNNING under other workers, in another queue
# A bad plan reads every RUNNING job (a walk of a partial index of them) or every job (a
# sequential scan), so both sizes stay 5x above ROWS_PER_OPERATION and the fill (most of each
# test's time) stays small: at these sizes a heartbeat fenced by a constant and the limited
# claim's count stating `state = 'RUNNING'` (migration 0062 undone) read 107-110 rows under
# both plan modes and after ANALYZE (PostgreSQL 18; 1,000 and 200 before, 2026-11-30).
PLANNED = 6  # runs before the table fills: from the sixth, the plan cache may keep a generic plan
MEASURED = 3
# Rows of `jobs` (and of every other table of the schema) one operation on one job may read:
# its row, a re-read for its answer, a dependent it settles and that one's re-reads. Measured
# 1-11 here; a plan that reads every finished job or every RUNNING one is far above.
ROWS_PER_OPERATION = 20
PLANS = ("auto", "force_generic_plan")

# the rows each table of the schema read in this transaction so far: sequential scans and
# index fetches, by name (job_events' partitions each by its own)
READ = """
SELECT s.relname, coalesce(s.seq_tup_read, 0) + coalesce(s.idx_tup_fetch, 0) AS rows
FROM pg_stat_xact_user_tables s
WHERE s.schemaname = 'evora'
"""

# An operation's preparation: makes the job it acts on (through `setup`, another pool) and
# returns the operation itself, run through `mine` (the measured connection, `conn`).
Operation = Callable[[], Awaitable[Any]]
Prepare = Callable[[JobStore, JobStore, asyncpg.Connection], Awaitable[Operation]]


async def reads(conn: asyncpg.Connection) -> dict[str, int]:
    return {r["relname"]: r["rows"] for r in await conn.fetch(READ)}


async def running(setup: JobStore) -> dict[str, Any]:
    await setup.submit_batch([JobSubmission(queue="q", type="t")])
    [job] = await setup.claim(worker_id="me", queues=["q"], max_jobs=1)
    return job


async def op_fail(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    return lambda: mine.fail_many([Failure(job["id"], job["lease_token"], "boom")])


# a failure reporting an upstream's retry-after: its key's bucket is drained first
async def op_fail_after(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    return lambda: mine.fail_many(
        [Failure(job["id"], job["lease_token"], "boom", retry_in_seconds=5, retry_after_key="k")]
    )


async def op_release(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    return lambda: mine.release(job["id"], job["lease_token"])


async def op_snooze(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    return lambda: mine.snooze(job["id"], job["lease_token"], delay_seconds=5)


async def op_heartbeat(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    return lambda: mine.heartbeat(job["id"], job["lease_token"])


async def op_cancel_pending(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    s = await setup.submit(JobSubmission(queue="p", type="t"))
    return lambda: mine.cancel(s.id)


async def op_cancel_running(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    return lambda: mine.cancel(job["id"])


# the api's read by id
async def op_get(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    s = await setup.submit(JobSubmission(queue="p", type="t"))
    return lambda: mine.get(s.id)


async def op_expire_leases(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    await conn.execute(
        "UPDATE evora.jobs SET lease_expires_at = evora.clock_now() - interval '1 s' WHERE id = $1",
        job["id"],
    )
    return lambda: mine.expire_leases()


async def op_expire_ttls(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    s = await setup.submit(JobSubmission(queue="p", type="t"))
    await conn.execute(
        "UPDATE evora.jobs SET expires_at = evora.clock_now() - interval '1 s' WHERE id = $1", s.id
    )
    return lambda: mine.expire_ttls()


async def op_complete(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    return lambda: mine.complete_many([Completion(job["id"], job["lease_token"])])


async def op_claim(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    await setup.submit_batch([JobSubmission(queue="c", type="t")])
    return lambda: mine.claim(worker_id="me", queues=["c"], max_jobs=10)


# a claim of a grouped job: the rule's probe of the group's RUNNING or SUSPENDED jobs states
# jobs_group_running's own predicate (rules.sql, group_turn), from which no partial index of
# RUNNING jobs alone is usable. Its probe of `state = 'RUNNING'` before migration 0063 walked
# jobs_running_lease under generic plans, every RUNNING job (208 rows beside 200 running)
async def op_claim_grouped(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    await setup.submit_batch([JobSubmission(queue="c", type="t", group_key=str(uuid4()))])
    return lambda: mine.claim(worker_id="me", queues=["c"], max_jobs=10)


async def op_retry(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    await setup.fail_many([Failure(job["id"], job["lease_token"], "boom", retryable=False)])
    return lambda: mine.retry(job["id"])


async def op_suspend(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    return lambda: mine.suspend(
        job["id"], job["lease_token"], timeout_seconds=60, on_timeout="resume"
    )


async def op_resolve(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    s = await setup.suspend(job["id"], job["lease_token"], timeout_seconds=60, on_timeout="resume")
    return lambda: mine.resolve_callback(s.callback_id, {"a": 1})


async def op_expire_callbacks(
    setup: JobStore, mine: JobStore, conn: asyncpg.Connection
) -> Operation:
    job = await running(setup)
    await setup.suspend(job["id"], job["lease_token"], timeout_seconds=60, on_timeout="resume")
    await conn.execute(
        "UPDATE evora.callbacks SET timeout_at = evora.clock_now() - interval '1 s' "
        "WHERE job_id = $1",
        job["id"],
    )
    return lambda: mine.expire_callbacks()


async def op_time_out(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    await conn.execute(
        "UPDATE evora.jobs SET max_duration_seconds = 1, started_at = evora.clock_now() - "
        "interval '1 hour' WHERE id = $1",
        job["id"],
    )
    return lambda: mine.time_out()


# a completion that releases a WAITING dependent (evora.settle_dependents())
async def op_settle(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    await setup.submit(JobSubmission(queue="w", type="t", depends_on=[job["id"]]))
    return lambda: mine.complete_many([Completion(job["id"], job["lease_token"])])


# a discard from the DLQ that cancels a WAITING dependent, outside the acks' functions
async def op_discard_settle(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    await setup.submit(JobSubmission(queue="w", type="t", depends_on=[job["id"]]))
    await setup.fail_many([Failure(job["id"], job["lease_token"], "boom", retryable=False)])
    return lambda: mine.discard(job["id"])


# the api's read of a job's events (job_events, partitioned by time)
async def op_events(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    job = await running(setup)
    return lambda: conn.fetch(queries.JOB_EVENTS, job["id"])


# the fair claim (a queue that received a job with a fairness key)
async def op_claim_fair(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    await setup.submit_batch([JobSubmission(queue="f", type="t", fairness_key="a")])
    return lambda: mine.claim(worker_id="me", queues=["f"], max_jobs=10)


# the limited claim (while any concurrency limit exists). Its count of the RUNNING jobs
# holding its keys walked jobs_running_lease here (every RUNNING job, twice: 414 rows to claim
# one job beside 200 running) until that count stated jobs_running_limit_keys' predicate in a
# form no other partial index of RUNNING jobs is usable from (migration 0062); it reads the
# key's holders, a few more each run (each run leaves one more RUNNING)
async def op_claim_limited(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    await LimitStore(setup._pool).put("tenant:*", LimitSpec(concurrency=1_000, rate=None))
    await setup.submit_batch([JobSubmission(queue="l", type="t", limit_keys=["tenant:a"])])
    return lambda: mine.claim(worker_id="me", queues=["l"], max_jobs=10)


# a repeated submission with an idempotency key, answered with the job it created before
async def op_submit_again(setup: JobStore, mine: JobStore, conn: asyncpg.Connection) -> Operation:
    submission = JobSubmission(queue="p", type="t", idempotency_key=str(uuid4()))
    await setup.submit(submission)
    return lambda: mine.submit_in(conn, [submission])


OPERATIONS: dict[str, Prepare] = {
    name.removeprefix("op_"): prepare
    for name, prepare in list(globals().items())
    if name.startswith("op_")
}


@pytest.mark.parametrize("name", sorted(OPERATIONS))
@pytest.mark.audit_skip("lease and deadline times are moved directly to make jobs due")
async def test_an_operation_reads_its_own_jobs_whatever_the_table_held_when_it_was_planned(
    name: str, make_db_url: MakeDatabase
) -> None:
    read = {plans: await measure(name, await make_db_url(), plans) for plans in PLANS}
    print(f"rows read to {name} one job beside {FINISHED} finished, {RUNNING} running: {read}")
    assert all(
        sum(per_table.values()) <= ROWS_PER_OPERATION
        for runs in read.values()
        for per_table in runs
    ), read


# The operations fenced on the job being RUNNING (`state = 'RUNNING'` beside its id and lease
# token). Written as a constant, or as a PL/pgSQL variable that a custom plan takes for one,
# the fence proves the partial indexes of RUNNING jobs usable, and a plan made from the
# statistics of the filled table walked all of jobs_running_lease (200 entries, cheaper than
# the primary key's two levels to the planner): a fence from a materialized CTE is a join
# condition, which proves nothing. The limited claim's count of the RUNNING holders of its
# keys likewise: with `state = 'RUNNING'` it walked jobs_running_lease under the filled
# table's statistics too (414 rows), where it now states the GIN index's own predicate.
FENCED = ("claim_limited", "fail_after", "heartbeat", "release", "snooze", "suspend")


@pytest.mark.parametrize("name", FENCED)
async def test_a_fenced_operation_reads_its_own_job_under_plans_made_from_statistics(
    name: str, make_db_url: MakeDatabase
) -> None:
    # auto: the api's and the sweeper's plan cache, which plans each call again while a
    # custom plan looks cheaper (the dispatcher's generic plans see the fence as a parameter)
    read = await measure(name, await make_db_url(), "auto", analyze=True)
    print(f"rows read to {name} one job after ANALYZE: {read}")
    assert all(sum(per_table.values()) <= ROWS_PER_OPERATION for per_table in read), read


async def measure(
    name: str, db_url: str, plans: str, *, analyze: bool = False
) -> list[dict[str, int]]:
    """Rows read per table by each of the MEASURED runs of operation `name` on one connection
    under `plans`, after PLANNED runs while the table was small; with `analyze`, the filled
    table is analyzed before them (as autovacuum would), so that they are planned again."""
    read: list[dict[str, int]] = []
    others = await create_pool(db_url, min_size=1, max_size=4)
    setup = JobStore(others)
    # a service's connection, made as the dispatcher makes its own
    one = await create_pool(
        db_url, min_size=1, max_size=1, generic_plans=plans == "force_generic_plan"
    )
    conn = await one.acquire()
    mine = JobStore(conn, hint_window=0.0)
    try:
        for n in range(PLANNED + MEASURED):
            if n == PLANNED:
                await fill(setup)
                if analyze:
                    await conn.execute("ANALYZE evora.jobs")
            operation = await OPERATIONS[name](setup, mine, conn)
            async with conn.transaction():
                before = await reads(conn)
                await operation()
                after = await reads(conn)
            if n >= PLANNED:
                read.append(
                    {t: r - before.get(t, 0) for t, r in after.items() if r > before.get(t, 0)}
                )
    finally:
        await one.release(conn)
        await one.close()
        await setup.close()
        await others.close()
    return read


async def fill(setup: JobStore) -> None:
    """FINISHED finished jobs and RUNNING running ones, in queues of their own. Each kind is
    submitted, claimed and completed by one statement apiece: a job's versions and events do
    not depend on the batch it moved in, so rounds of 100 made the same rows. Nothing asks
    for the jobs back that it does not read."""
    await setup.submit_batch(
        [
            JobSubmission(queue="done", type="t", idempotency_key=str(uuid4()))
            for _ in range(FINISHED)
        ],
        with_jobs=False,
    )
    taken = await setup.claim(worker_id="w", queues=["done"], max_jobs=FINISHED)
    assert len(taken) == FINISHED
    await setup.complete_many(
        [Completion(r["id"], r["lease_token"]) for r in taken], with_jobs=False
    )
    await setup.submit_batch(
        [JobSubmission(queue="busy", type="t") for _ in range(RUNNING)], with_jobs=False
    )
    assert len(await setup.claim(worker_id="w", queues=["busy"], max_jobs=RUNNING)) == RUNNING
