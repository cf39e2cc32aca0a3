"""A claim of grouped (FIFO) jobs costs what its own candidates cost, not what runs elsewhere.

A grouped job is claimable only while no job of its group runs and no earlier job of its group
waits. Asked as `NOT EXISTS (SELECT 1 FROM evora.jobs r WHERE r.state = 'RUNNING' AND r.queue =
j.queue AND r.group_key = j.group_key)`, the planner may answer the question once for every
group instead of once per candidate: a hashed subplan built from every RUNNING job of every
queue (through an index on state; `state` keeps no statistics, so it expects a few hundred),
read in full by each claim. The group indexes answer it with one probe per candidate. The
count of rows read is exact (the transaction's own statistics), so the bounds below involve no
timing; both the plain claim and the limited one (evora.claim_limited(), taken while any flow
limit exists) are measured, under custom and generic plans."""

from __future__ import annotations

import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.jobs import Completion, JobStore
from evora.storage.limits import LimitSpec, LimitStore

ELSEWHERE = 3_000  # grouped jobs RUNNING in another queue, each the one job of its group
BACKLOG = 20_000  # grouped jobs waiting in a third queue, 20 per group
CLAIMED = 20
# Per claimed job: its own row, the row of the job before it that the claim skips (its group
# runs), each one's probes of the group indexes, the change and the index entries it checks;
# the limited claim also reads the window of the queue behind what it takes. Measured: 4 rows
# and 5 index entries per job for the plain claim, 6 and 7 for the limited one; far below
# ELSEWHERE / CLAIMED = 150, what reading every RUNNING job once per claim costs.
READ_PER_CLAIMED_JOB = 12

# asyncpg prepares every statement, and from its sixth run PostgreSQL may keep a generic plan,
# made without the parameters' values (so may the statements of a PL/pgSQL function): both
# kinds of plan must probe per candidate.
PLANS = ("auto", "force_generic_plan")
PATHS = ("plain", "limited")


async def jobs_read(conn: asyncpg.Connection) -> tuple[int, int]:
    """The rows of `jobs` read so far in this transaction, and the entries of its indexes
    (an index-only scan reads entries and no rows)."""
    row = await conn.fetchrow(
        """
        SELECT (SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
                FROM pg_stat_xact_user_tables WHERE relname = 'jobs') AS rows,
               (SELECT sum(pg_stat_get_xact_tuples_returned(indexrelid))::bigint
                FROM pg_index WHERE indrelid = 'evora.jobs'::regclass) AS entries
        """
    )
    assert row is not None
    return row["rows"], row["entries"]


def _grouped(queue: str, groups: list[str], per_group: int) -> list[JobSubmission]:
    """`per_group` jobs of each group, submitted in turns (one of each, then again)."""
    return [
        JobSubmission(queue=queue, type="t", group_key=group)
        for _ in range(per_group)
        for group in groups
    ]


async def test_a_grouped_claim_reads_rows_for_its_candidates_not_for_every_running_job(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    # the fill asks for ids only: decoding its 23,000 jobs cost ~2 of this test's ~6 CPU s
    for n in range(BACKLOG // 1000):
        await store.submit_batch(
            _grouped("backlog", [f"b{n}-{g}" for g in range(50)], 20), with_jobs=False
        )
    for n in range(ELSEWHERE // 1000):
        await store.submit_batch(
            _grouped("busy", [f"g{n}-{g}" for g in range(1000)], 1), with_jobs=False
        )
        assert len(await store.claim(worker_id="others", queues=["busy"], max_jobs=1000)) == 1000
    # In "mine", the first jobs in line belong to groups that already run (their heads were
    # claimed), so the claim skips them; then come the heads it takes, each followed by a job
    # of its own group that must wait.
    running = [f"running-{g}" for g in range(CLAIMED)]
    await store.submit_batch(_grouped("mine", running, 2))
    assert len(await store.claim(worker_id="others", queues=["mine"], max_jobs=CLAIMED)) == CLAIMED
    free = [f"free-{g}" for g in range(CLAIMED)]
    await store.submit_batch(_grouped("mine", free, 2))

    read: dict[tuple[str, str], tuple[int, int]] = {}
    async with pool.acquire() as conn:
        await conn.execute("ANALYZE evora.jobs")
        for path in PATHS:
            if path == "limited":
                # a limit that governs no job of "mine": the claim only takes the other path
                await LimitStore(pool).put("tenant:*", LimitSpec(concurrency=1, rate=None))
            for plans in PLANS:
                await conn.execute(f"SET plan_cache_mode = {plans}")
                tx = conn.transaction()
                await tx.start()
                try:
                    rows_before, entries_before = await jobs_read(conn)
                    claimed = await conn.fetch(queries.CLAIM, ["mine"], None, CLAIMED, "me")
                    rows_after, entries_after = await jobs_read(conn)
                finally:
                    # every case claims the same heads
                    await tx.rollback()
                assert sorted(r["job"]["group_key"] for r in claimed) == sorted(free)
                assert {r["job"]["limited"] for r in claimed} == {False}
                read[path, plans] = (rows_after - rows_before, entries_after - entries_before)
    print(f"(rows, index entries) of jobs read to claim {CLAIMED} grouped jobs: {read}")
    assert all(
        rows <= CLAIMED * READ_PER_CLAIMED_JOB and entries <= CLAIMED * READ_PER_CLAIMED_JOB
        for rows, entries in read.values()
    ), f"(rows, index entries) of jobs read to claim {CLAIMED} grouped jobs: {read}"


FINISHED = 300  # finished jobs still in `jobs`, as retention keeps them for a while
# A plan that reads the table reads every finished job: 300 keep it 25x above the bound
# (1,000 before, most of the test's time). At 300, evora.claim_jobs() moving its jobs by the
# join alone (no `j.id = ANY(ids)`, default random_page_cost) read 303-607 rows (PostgreSQL
# 18, 2026-11-30).


async def test_a_claim_moves_its_jobs_by_primary_key_however_many_finished_jobs_remain(
    store: JobStore, db_url: str
) -> None:
    """evora.claim_jobs() moves the picked jobs by id. Planned without the ids (a generic
    plan, the dispatcher's), the planner takes an array parameter for 10 elements and may
    hash them against a sequential scan of `jobs`: cheaper on paper while the table is
    small, and then every claim reads every job still in the table, the finished ones too
    (2026-11-29: ~0.45 ms per one-job claim with 2,000 jobs kept, in the wake of every job).
    A dispatcher's connection plans each statement once, so whatever the table held then,
    both kinds of plan must read the claimed rows only."""
    read: dict[str, list[int]] = {}
    for plans in PLANS:
        # as a dispatcher's connection: its claims drain a backlog, then wait for new jobs
        conn = await asyncpg.connect(db_url, server_settings={"plan_cache_mode": plans})
        try:
            await store.submit_batch(
                [JobSubmission(queue="done", type="t") for _ in range(FINISHED)]
            )
            while taken := await conn.fetch(queries.CLAIM, ["done"], None, 100, "w"):
                await store.complete_many(
                    [Completion(r["job"]["id"], r["job"]["lease_token"]) for r in taken]
                )
            for _ in range(3):
                await store.submit_batch([JobSubmission(queue="q", type="t")])
                async with conn.transaction():
                    rows_before, _ = await jobs_read(conn)
                    claimed = await conn.fetch(queries.CLAIM, ["q"], None, 100, "me")
                    rows_after, _ = await jobs_read(conn)
                assert len(claimed) == 1
                read.setdefault(plans, []).append(rows_after - rows_before)
        finally:
            await conn.close()
    print(f"rows of jobs read to claim 1 job beside {FINISHED} finished ones: {read}")
    assert all(rows <= READ_PER_CLAIMED_JOB for per in read.values() for rows in per), read
