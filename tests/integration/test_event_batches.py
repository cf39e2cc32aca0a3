"""The hot transitions' events are one row per statement (migration 0064, evora.event_batches):
under concurrent claims, completions, failures and submissions from many connections, every
event still has a seq of its own, a batch's seqs rise in the order of its events, and the
seqs of one transaction's rows and batches never interleave (the span reader orders a
transaction's batches by their last seq)."""

from __future__ import annotations

import asyncio
import random

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import Completion, Failure, JobStore

WORKERS = 8
ROUNDS = 6


async def _work(store: JobStore, worker: str, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(ROUNDS):
        await store.submit_batch(
            [JobSubmission(queue="q", type="t", max_attempts=2) for _ in range(rng.randint(1, 6))]
        )
        jobs = await store.claim(worker_id=worker, queues=["q"], max_jobs=rng.randint(1, 8))
        done = [j for j in jobs if rng.random() < 0.7]
        await store.complete_many([Completion(j["id"], j["lease_token"]) for j in done])
        for job in jobs:
            if job not in done:
                await store.fail(Failure(job["id"], job["lease_token"], "x", retry_in_seconds=0))


async def test_concurrent_writers_give_every_event_its_own_seq_in_order(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    await asyncio.gather(*(_work(store, f"w{n}", n) for n in range(WORKERS)))
    assert await pool.fetchval("SELECT count(*) FROM evora.event_batches") > WORKERS
    counts = await pool.fetchrow(
        "SELECT count(*) AS events, count(DISTINCT seq) AS seqs FROM evora.job_events"
    )
    assert counts["events"] == counts["seqs"]
    # a batch's seqs rise, its first and last are the indexes' columns, and it holds one
    # value per event in every array
    assert not await pool.fetch(
        "SELECT seq FROM evora.event_batches b"
        " WHERE seqs <> ARRAY(SELECT s FROM unnest(b.seqs) s ORDER BY s)"
        "    OR seq <> seqs[1] OR last_seq <> seqs[cardinality(seqs)]"
        "    OR cardinality(seqs) <> cardinality(job_ids)"
        "    OR cardinality(seqs) <> cardinality(jobs)"
        "    OR cardinality(seqs) <> cardinality(events)"
    )
    # within a transaction, each row and each batch holds a range of seq no other reaches into
    overlaps = await pool.fetch(
        """
        WITH ranges AS (
            SELECT xid, seq AS lo, seq AS hi FROM evora.job_event_rows
            UNION ALL
            SELECT xid, seq, last_seq FROM evora.event_batches
        )
        SELECT a.xid FROM ranges a JOIN ranges b
          ON a.xid = b.xid AND (a.lo, a.hi) <> (b.lo, b.hi) AND a.lo <= b.hi AND b.lo <= a.hi
        """
    )
    assert not overlaps
    # each job's events rise in seq as its version does
    assert not await pool.fetch(
        "SELECT job_id FROM (SELECT job_id, job_version,"
        "  lag(seq) OVER (PARTITION BY job_id ORDER BY job_version) AS before, seq"
        "  FROM evora.job_events) e WHERE before >= seq"
    )


async def test_the_view_unfolds_a_batch_as_the_readers_do(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """`job_events` writes its unfolding of a batch out (a role let read it needs no grant on
    a function); the readers by seq and by job use evora.batch_events(): the two agree, event
    for event, data and images included."""
    await _work(store, "w", 1)
    assert await pool.fetchval("SELECT count(*) FROM evora.event_batches") > 0
    view = await pool.fetch("SELECT e::text FROM evora.job_events e ORDER BY seq")
    readers = await pool.fetch(
        "SELECT e::text FROM (SELECT * FROM evora.job_event_rows UNION ALL"
        " SELECT v.* FROM evora.event_batches b CROSS JOIN LATERAL evora.batch_events(b) v) e"
        " ORDER BY seq"
    )
    assert view == readers
    last = await pool.fetchval("SELECT max(seq) FROM evora.job_events")
    assert (
        await pool.fetch(
            "SELECT e::text FROM evora.events_in_seq_range(0, $1) e ORDER BY seq", last + 1
        )
        == view
    )


async def test_a_batch_with_an_array_shorter_than_its_seqs_is_refused(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """Migration 0065: the view would unfold a short array as NULL fields; the constraint
    refuses such a row at its INSERT, and it is validated on the rows already there."""
    await _work(store, "w", 2)
    assert await pool.fetchval(
        "SELECT bool_and(convalidated) FROM pg_constraint WHERE conname = 'event_batches_shape'"
    )
    # a copy of a writer's row with one seq more than its other arrays hold
    with pytest.raises(asyncpg.CheckViolationError, match="event_batches_shape"):
        await pool.execute(
            "INSERT INTO evora.event_batches (seqs, at, job_ids, job_versions, queues, types,"
            " events, from_states, to_states, attempts, worker_ids, data, jobs)"
            " SELECT evora.next_seqs(cardinality(seqs) + 1), at, job_ids, job_versions, queues,"
            " types, events, from_states, to_states, attempts, worker_ids, data, jobs"
            " FROM evora.event_batches LIMIT 1"
        )
