"""Retention: finished jobs past their window are deleted in bounded batches and counted in
job_prune_counts; live and younger jobs, and every event, stay; idempotency keys follow
their own window. Jobs grow old by running the database's clock ahead (the `clock`
fixture)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from uuid import UUID, uuid4

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.protocol.states import JobState
from evora.storage.jobs import Completion, Failure, JobStore
from evora.storage.retention import PRUNABLE_STATES, PRUNE_FINISHED, RetentionStore
from tests.conftest import Clock
from tests.polling import until
from tests.sweeper.conftest import FAST, StartSweeper

DAY = 86_400
BATCH = 4


async def finished(
    store: JobStore, queue: str, state: JobState, count: int, batch: str = ""
) -> list[UUID]:
    """`count` jobs of `queue` moved to a finished state the way workers and producers do
    (`batch` tells apart the idempotency keys of several calls for one queue and state)."""
    subs = [
        JobSubmission(
            queue=queue, type="t", max_attempts=1, idempotency_key=f"{queue}-{state}-{batch}{i}"
        )
        for i in range(count)
    ]
    ids = [s.job["id"] for s in await store.submit_batch(subs)]
    if state == JobState.CANCELLED:
        for job_id in ids:
            await store.cancel(job_id)
        return ids
    claimed = await store.claim(worker_id="w", queues=[queue], max_jobs=count)
    assert {j["id"] for j in claimed} == set(ids)
    if state == JobState.COMPLETED:
        await store.complete_many([Completion(j["id"], j["lease_token"]) for j in claimed])
    else:
        await store.fail_many(
            [Failure(j["id"], j["lease_token"], "boom", retryable=False) for j in claimed]
        )
    return ids


async def prune_counts(pool: asyncpg.Pool) -> dict[tuple[str, str], int]:
    rows = await pool.fetch("SELECT queue, state, pruned FROM evora.job_prune_counts")
    return {(r["queue"], r["state"]): r["pruned"] for r in rows}


async def test_old_finished_jobs_are_pruned_and_accounted_for(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    # Jobs finish in three batches with the clock run ahead after each: by the end they
    # finished 8, 2 and half a day ago. DLQ keeps its jobs for 7 days, the others for one.
    batches = (("ancient", 6 * DAY), ("recent", 1.5 * DAY), ("young", 0.5 * DAY))
    made: dict[tuple[str, JobState, str], list[UUID]] = {}
    for batch, then in batches:
        for queue in ("a", "b"):
            for state in PRUNABLE_STATES:
                count = (11 if queue == "a" else 5) - 4 if batch == "ancient" else 2
                made[(queue, state, batch)] = await finished(store, queue, state, count, batch)
        await clock.advance(then)
    old: dict[tuple[str, JobState], list[UUID]] = {}
    kept: list[UUID] = []
    for queue in ("a", "b"):
        for state in PRUNABLE_STATES:
            ancient, recent, young = (made[(queue, state, batch)] for batch, _ in batches)
            if state == JobState.DLQ:
                old[(queue, state)] = ancient
                kept += recent + young
            else:
                old[(queue, state)] = ancient + recent
                kept += young
    live = [
        (await store.submit(JobSubmission(queue="a", type="t", max_attempts=1))).job["id"],
        (await store.submit(JobSubmission(queue="b", type="t", delay_seconds=3600))).job["id"],
    ]
    [running] = await store.claim(worker_id="w", queues=["a"])
    events_before = await pool.fetchval("SELECT count(*) FROM evora.job_events")
    states_before = Counter(r["state"] for r in await pool.fetch("SELECT state FROM evora.jobs"))

    # One statement removes at most its batch.
    retention = RetentionStore(pool)
    assert await retention.prune_finished(JobState.COMPLETED, DAY, BATCH) == BATCH

    sweeper = await start_sweeper(replace(FAST, prune_batch=BATCH))
    expected = sum(len(ids) for ids in old.values())

    def pruned_jobs() -> float:
        kinds = ("completed", "cancelled", "dlq")
        return sum(sweeper.metric("evora_sweeper_pruned_total", kind=k) for k in kinds)

    await until(lambda: pruned_jobs() + BATCH == expected, "old jobs to be pruned")

    # The pass that pruned the last jobs removes their idempotency keys after them (older than
    # the keys' window by now): let it finish, or the pass below would find those keys.
    async def keys_of_pruned_jobs_gone() -> bool:
        left = await pool.fetchval(
            "SELECT count(*) FROM evora.idempotency_keys k"
            " WHERE NOT EXISTS (SELECT 1 FROM evora.jobs j WHERE j.id = k.job_id)"
        )
        return bool(left == 0)

    await until(keys_of_pruned_jobs_gone, "their idempotency keys to be pruned")

    remaining = {r["id"] for r in await pool.fetch("SELECT id FROM evora.jobs")}
    assert remaining == set(kept) | set(live)
    assert running["id"] in live
    counts = await prune_counts(pool)
    assert counts == {(q, s.value): len(ids) for (q, s), ids in old.items()}
    # What the read models may rely on: counts derived from events minus the pruned ones
    # equal the true per-state counts.
    states_after = Counter(r["state"] for r in await pool.fetch("SELECT state FROM evora.jobs"))
    for state, before in states_before.items():
        gone = sum(n for (_, s), n in counts.items() if s == state)
        assert states_after[state] == before - gone, state
    assert await pool.fetchval("SELECT count(*) FROM evora.job_events") == events_before
    assert sweeper.metric("evora_sweeper_pruned_total", kind="dlq") == 7 + 1

    # Another pass finds nothing more.
    assert sum((await sweeper.sweeper.prune_due()).values()) == 0
    assert await prune_counts(pool) == counts


async def test_idempotency_keys_are_pruned_by_age_but_never_while_their_job_exists(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool
) -> None:
    [done] = await finished(store, "k", JobState.COMPLETED, 1)
    [dead] = await finished(store, "k", JobState.DLQ, 1)
    [waiting] = [
        s.job["id"]
        for s in await store.submit_batch(
            [JobSubmission(queue="k", type="t", idempotency_key="scheduled", delay_seconds=9e5)]
        )
    ]
    fresh = await store.submit(JobSubmission(queue="k", type="t", idempotency_key="fresh"))
    old_keys = [f"spare-{i}" for i in range(9)]
    # Keys whose jobs are long gone (pruned) or never existed beyond the key.
    await pool.executemany(
        "INSERT INTO evora.idempotency_keys (queue, key, fingerprint, job_id, created_at) "
        "VALUES ('k', $1, '\\x00', gen_random_uuid(), now() - interval '8 days')",
        [(key,) for key in old_keys],
    )
    # Past the key window, while their jobs (finished or not) are still stored. The keys are
    # aged one by one rather than by running the `clock` ahead, which would age the `fresh`
    # key (and make the finished jobs prunable) along with them.
    await pool.execute(
        "UPDATE evora.idempotency_keys SET created_at = now() - interval '8 days' WHERE job_id"
        " = ANY($1)",
        [done, dead, waiting],
    )

    sweeper = await start_sweeper(replace(FAST, prune_batch=BATCH))
    await until(
        lambda: sweeper.metric("evora_sweeper_pruned_total", kind="idempotency_keys") == 9,
        "old keys to be pruned",
    )
    owners = {r["job_id"] for r in await pool.fetch("SELECT job_id FROM evora.idempotency_keys")}
    # Only the keys without a job went: every stored job keeps its key, in any state.
    assert owners == {done, dead, waiting, fresh.job["id"]}
    dead_job = await store.get(dead)
    assert dead_job["state"] == "DLQ"
    # So replaying the DLQ job's submission answers with it instead of making a second job.
    replay = await store.submit(
        JobSubmission(
            queue="k", type="t", max_attempts=1, idempotency_key=dead_job["idempotency_key"]
        )
    )
    assert not replay.created and replay.job["id"] == dead
    assert await prune_counts(pool) == {}  # no job was removed


@pytest.mark.parametrize("state", PRUNABLE_STATES)
async def test_prunes_use_the_finished_index_even_with_a_generic_plan(
    pool: asyncpg.Pool, state: JobState
) -> None:
    """The candidates are picked inside evora.prune_finished() (migration 0024), by a statement
    of its own whose plan PL/pgSQL caches: the index scans of this transaction tell which
    index it read."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        assert await conn.fetchval(PRUNE_FINISHED, float(DAY), 1000, state.value) == 0
        scans: int = await conn.fetchval(
            "SELECT pg_stat_get_xact_numscans('evora.jobs_finished'::regclass)"
        )
    assert scans > 0


# Rows of other tables that name a job, by table: what a job leaves behind it.
REFERENCES = """
SELECT 'callbacks' AS t, count(*) AS n FROM evora.callbacks WHERE job_id = ANY($1::uuid[])
UNION ALL SELECT 'dependencies', count(*) FROM evora.job_dependencies WHERE job_id = ANY($1)
UNION ALL SELECT 'traces', count(*) FROM evora.job_traces WHERE job_id = ANY($1)
UNION ALL SELECT 'children', count(*) FROM evora.spawned_children WHERE parent = ANY($1)
"""


async def add_references(pool: asyncpg.Pool, job_ids: list[UUID]) -> None:
    """A settled callback, a dependency edge, a trace context and a spawned child for each of
    `job_ids`, written directly: which path wrote a row does not matter to its removal."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO evora.callbacks (id, secret_hash, job_id, attempt, on_timeout,"
            " created_at, timeout_at, outcome, settled_at)"
            " SELECT gen_random_uuid(), sha256(uuid_send(j)), j, 1, 'fail', evora.clock_now(),"
            " evora.clock_now(), 'resolved', evora.clock_now() FROM unnest($1::uuid[]) AS j",
            job_ids,
        )
        await conn.execute(
            "INSERT INTO evora.job_dependencies (job_id, depends_on)"
            " SELECT j, gen_random_uuid() FROM unnest($1::uuid[]) AS j",
            job_ids,
        )
        await conn.execute(
            "INSERT INTO evora.job_traces (job_id, traceparent)"
            " SELECT j, '00-' || md5(j::text) || '-0000000000000001-01'"
            " FROM unnest($1::uuid[]) AS j",
            job_ids,
        )
        await conn.execute(
            "INSERT INTO evora.spawned_children (parent, child)"
            " SELECT j, gen_random_uuid() FROM unnest($1::uuid[]) AS j",
            job_ids,
        )


async def references(pool: asyncpg.Pool, job_ids: list[UUID]) -> dict[str, int]:
    return {r["t"]: r["n"] for r in await pool.fetch(REFERENCES, job_ids)}


async def test_a_removed_jobs_references_go_with_it_and_no_other_jobs(
    store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    """What a job leaves in other tables goes with it when retention removes it, and when an
    operator deletes a finished job (the statement trigger jobs_references_removed; foreign
    keys did this until migration 0061); the rows of jobs that stay are kept, also an edge
    that names a removed job as the dependency of a kept one (it belongs to the kept job)."""
    old = await finished(store, "refs", JobState.COMPLETED, 5, "old")
    await clock.advance(2 * DAY)
    young = await finished(store, "refs", JobState.COMPLETED, 3, "young")
    await add_references(pool, old + young)
    await pool.execute(
        "INSERT INTO evora.job_dependencies (job_id, depends_on) VALUES ($1, $2)", young[0], old[0]
    )

    assert await RetentionStore(pool).prune_finished(JobState.COMPLETED, DAY, 100) == len(old)
    assert await references(pool, old) == dict.fromkeys(REFERENCE_TABLES, 0)
    assert await references(pool, young) == {
        **dict.fromkeys(REFERENCE_TABLES, 3),
        "dependencies": 4,
    }

    # an operator's DELETE of two jobs (counted as retention counts its own, which the
    # auditor checks every test's history against)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("DELETE FROM evora.jobs WHERE id = ANY($1::uuid[])", young[1:])
        await conn.execute(
            "UPDATE evora.job_prune_counts SET pruned = pruned + 2"
            " WHERE queue = 'refs' AND state = 'COMPLETED'"
        )
    assert await references(pool, young[1:]) == dict.fromkeys(REFERENCE_TABLES, 0)
    assert await references(pool, young[:1]) == {
        **dict.fromkeys(REFERENCE_TABLES, 1),
        "dependencies": 2,
    }
    # a DELETE that removes nothing touches nothing
    await pool.execute("DELETE FROM evora.jobs WHERE id = $1", uuid4())
    assert await references(pool, young[:1]) == {
        **dict.fromkeys(REFERENCE_TABLES, 1),
        "dependencies": 2,
    }


REFERENCE_TABLES = ("callbacks", "dependencies", "traces", "children")


async def test_no_foreign_key_references_jobs_and_the_trigger_is_in_place(
    pool: asyncpg.Pool,
) -> None:
    """Migration 0061's end state, which the schema dump also pins: no foreign key references
    `jobs` (each ran a query per deleted job), and the statement trigger is in place."""
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM pg_constraint WHERE contype = 'f'"
            " AND confrelid = 'evora.jobs'::regclass"
        )
        == 0
    )
    assert await pool.fetchval(
        "SELECT tgenabled <> 'D' FROM pg_trigger WHERE tgname = 'jobs_references_removed'"
        " AND tgrelid = 'evora.jobs'::regclass"
    )
