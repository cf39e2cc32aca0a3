"""A job's timeline is found through the milliseconds its batch's jobs were created in
(migration 0066, event_batches_job_times): a batch adds a key per millisecond instead of one
per job, the timeline holds exactly the job's events however many jobs share its millisecond,
and an upgrade builds the index on a large partition CONCURRENTLY after the migration,
reading it through the old index until then, and going on, the invalid index it left
dropped and built again, after a long transaction stopped it."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from evora.config import Settings
from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.drift import drift
from evora.storage.jobs import Completion, Failure, JobStore
from evora.storage.migrate import (
    PARTITION_INDEXES_MISSING,
    _build_and_attach,
    apply_migrations,
    build_partition_indexes,
    unfinished_index_builds,
)
from evora_services.cli.doctor import run_checks
from tests.integration.held_builds import migrate_past_an_open_transaction

# the exact events of a job, read through the view (which unfolds every batch: slow, but
# with no index to trust)
EXACT = """
SELECT seq, job_id, event, from_state, to_state, attempt
FROM evora.job_events WHERE job_id = $1 ORDER BY seq
"""

# the scans of each index and each table this backend counted but has not reported yet
# (those of this transaction, and of earlier ones not yet flushed to the statistics): a
# partition's index by its partitioned index's name, the batches' partitions as one table
SCANS = """
SELECT CASE WHEN c.relkind = 'i' THEN coalesce(p.relname, c.relname)
            WHEN c.relname LIKE 'event\\_batches\\_p%' THEN 'event_batches' END AS name,
       sum(pg_stat_get_xact_numscans(c.oid)) AS scans
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_inherits h ON h.inhrelid = c.oid LEFT JOIN pg_class p ON p.oid = h.inhparent
WHERE n.nspname = 'evora' AND c.relkind IN ('i', 'r')
GROUP BY 1
"""


def _fields(rows: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (r["seq"], r["job_id"], r["event"], r["from_state"], r["to_state"], r["attempt"])
        for r in rows
    ]


async def _timeline(conn: asyncpg.Connection, job_id: UUID) -> tuple[list[Any], set[str], int]:
    """The job's events as the api reads them, with the indexes that read found them by and
    the sequential scans of the batches' partitions it made."""
    async with conn.transaction():
        before = {r["name"]: r["scans"] for r in await conn.fetch(SCANS)}
        rows = await conn.fetch(queries.JOB_EVENTS, job_id)
        after = {r["name"]: r["scans"] for r in await conn.fetch(SCANS)}
    scanned = {name for name, n in after.items() if n > before.get(name, 0)}
    seq_scans = after.get("event_batches", 0) - before.get("event_batches", 0)
    return sorted(rows, key=lambda r: r["seq"]), scanned - {"event_batches"}, seq_scans


async def test_a_batch_of_jobs_submitted_together_adds_one_key(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    await store.submit_batch([JobSubmission(queue="q", type="t") for _ in range(200)])
    await store.claim(worker_id="w", queues=["q"], max_jobs=100)
    keys = await pool.fetch(
        "SELECT cardinality(job_ids) AS jobs,"
        " (SELECT count(DISTINCT k) FROM unnest(evora.job_id_times(job_ids)) k) AS keys"
        " FROM evora.event_batches ORDER BY seq"
    )
    # the submission's batch, then the claim's: 200 and 100 jobs of one millisecond each
    assert [(r["jobs"], r["keys"]) for r in keys] == [(200, 1), (100, 1)]
    # an id's key is its first 6 bytes, its creation's millisecond, once per run of ids
    # that share it
    assert await pool.fetchval(
        "SELECT evora.job_id_times(ARRAY['0192f6a4-1b2c-7d3e-8f40-123456789abc'::uuid,"
        " '0192f6a4-1b2c-7fff-bfff-ffffffffffff'::uuid,"
        " '0192f6a4-1b2d-7000-8000-000000000000'::uuid])"
    ) == [bytes.fromhex("0192f6a41b2c"), bytes.fromhex("0192f6a41b2d")]


async def test_a_timeline_holds_exactly_its_jobs_events_among_those_of_its_millisecond(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """300 jobs of one submission share a millisecond and so every key of their batches;
    jobs submitted in SQL (ids made by evora.uuid7() one by one), single submissions, retries,
    cancels (events in rows, not batches) and completions around them."""
    together = await store.submit_batch(
        [JobSubmission(queue="q", type="t", max_attempts=3) for _ in range(300)]
    )
    alone = [(await store.submit(JobSubmission(queue="q", type="t"))).id for _ in range(3)]
    in_sql = await pool.fetchval(
        "SELECT evora.submit_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'q',"
        " 'type', 'sql')) FROM generate_series(1, 20)))"
    )
    cancelled = together[-1].id
    await store.cancel(cancelled)
    while jobs := await store.claim(worker_id="w", queues=["q"], max_jobs=64):
        done = [j for n, j in enumerate(jobs) if n % 3]
        await store.complete_many([Completion(j["id"], j["lease_token"]) for j in done])
        for job in jobs[::3]:
            await store.fail(Failure(job["id"], job["lease_token"], "x", retry_in_seconds=0))
    ids = [s.id for s in together[:5]] + [together[150].id, cancelled, *alone, *in_sql[:3]]
    async with pool.acquire() as conn:
        for job_id in ids:
            exact = _fields(await conn.fetch(EXACT, job_id))
            rows, used, seq_scans = await _timeline(conn, job_id)
            assert _fields(rows) == exact
            assert {e[1] for e in exact} == {job_id} and exact[0][2] == "submitted"
            assert "event_batches_job_times" in used, used
            assert seq_scans == 0
        # a retried job's timeline holds every attempt
        retried = await conn.fetchval(
            "SELECT job_id FROM evora.job_events WHERE event = 'failed' LIMIT 1"
        )
        rows, _, _ = await _timeline(conn, retried)
        assert _fields(rows) == _fields(await conn.fetch(EXACT, retried))
        events = [r["event"] for r in rows]
        assert events.count("claimed") >= 2 and "failed" in events, events


async def _at_0065(url: str) -> None:
    """A database migrated up to 0065 (the function files are not, in a partial run), with
    the twin of the outbox's first partition that `evora migrate` makes after the
    migrations, for the batches of old times."""
    await apply_migrations(url, upto=65)
    conn = await asyncpg.connect(url)
    try:
        bound = await conn.fetchval(
            "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_class c"
            " WHERE c.oid = 'evora.job_events_pinitial'::regclass"
        )
        await conn.execute(
            f"CREATE TABLE evora.event_batches_pinitial PARTITION OF evora.event_batches {bound}"
        )
    finally:
        await conn.close()


async def _fill_batches(conn: asyncpg.Connection, rows: int, per_row: int) -> list[UUID]:
    """`rows` batches of `per_row` events each, as the schema of migration 0065 holds them
    (the events alone: the indexes read nothing else), for jobs of random ids (as before ids
    were UUIDv7s), in the first partition; the ids of the first batch's jobs.
    The correlated `WHERE b >= 0` makes each batch's ids its own."""
    ids: list[UUID] = await conn.fetchval(
        """
        WITH made AS (
            INSERT INTO evora.event_batches (seqs, at, job_ids, job_versions, queues, types,
                                             events, from_states, to_states, attempts,
                                             worker_ids, data, jobs)
            SELECT evora.next_seqs(n), '2000-01-01'::timestamptz,
                   ARRAY(SELECT gen_random_uuid() FROM generate_series(1, n) WHERE b >= 0),
                   array_fill(1, ARRAY[n]), array_fill('q'::text, ARRAY[n]),
                   array_fill('t'::text, ARRAY[n]), array_fill('submitted'::text, ARRAY[n]),
                   array_fill(NULL::evora.job_state, ARRAY[n]),
                   array_fill('PENDING'::evora.job_state, ARRAY[n]), array_fill(0, ARRAY[n]),
                   array_fill(NULL::text, ARRAY[n]), NULL,
                   array_fill(NULL::evora.job_image, ARRAY[n])
            FROM generate_series(0, $1::int - 1) AS b, (SELECT $2::int AS n) p
            RETURNING job_ids, seq
        )
        SELECT job_ids FROM made ORDER BY seq LIMIT 1
        """,
        rows,
        per_row,
    )
    return ids


async def _keep_writing(
    url: str, going: asyncio.Event, stop: asyncio.Event, written: list[UUID]
) -> None:
    """Batch rows of 3 events into the first partition, one after another, until `stop`
    (`going` once 10 are in); their jobs' ids into `written`."""
    conn = await asyncpg.connect(url)
    try:
        while not stop.is_set():
            written += await _fill_batches(conn, 1, 3)
            if len(written) >= 30:
                going.set()
    finally:
        await conn.close()


async def test_the_upgrade_builds_the_index_of_a_large_partition_after_the_migration(
    empty_db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    await _at_0065(empty_db_url)
    conn = await asyncpg.connect(empty_db_url)
    holder = await asyncpg.connect(empty_db_url)
    try:
        # larger than a partition the migration builds the index on at once (8 MB)
        first = await _fill_batches(conn, 3_000, 50)
        big = await conn.fetchval(
            "SELECT c.relname FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid"
            " WHERE h.inhparent = 'evora.event_batches'::regclass"
            "   AND pg_total_relation_size(c.oid) >= 8 * 1024 * 1024"
        )
        assert big is not None
        # a transaction open since before the build: CREATE INDEX CONCURRENTLY waits for it
        applied, held = await migrate_past_an_open_transaction(empty_db_url, holder, caplog)
        assert 66 in applied
        # the migration is applied; the large partition still has only the old index, which
        # the timeline reads it through (the new index is not valid yet)
        assert (
            await conn.fetchval(
                "SELECT indisvalid FROM pg_index"
                " WHERE indexrelid = 'evora.event_batches_job_times'::regclass"
            )
            is False
        )
        assert await conn.fetchval("SELECT to_regclass('evora.event_batches_jobs')") is not None
        assert await conn.fetch("SELECT name, replaced_by FROM evora.retiring_indexes") == [
            ("event_batches_jobs", "event_batches_job_times")
        ]
        rows, used, seq_scans = await _timeline(conn, first[7])
        assert [(r["job_id"], r["event"]) for r in rows] == [(first[7], "submitted")]
        assert "event_batches_jobs" in used and seq_scans == 0, used
        # the build that gave up left its index of the partition behind, invalid (and
        # unattached): the next run drops it and builds it again
        leftover = await conn.fetchval(
            "SELECT x.indisvalid FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid"
            " WHERE c.relname = $1 AND NOT EXISTS (SELECT FROM pg_inherits h"
            "                                      WHERE h.inhrelid = c.oid)",
            f"{big[:30]}_job_times",
        )
        assert leftover is False
        # `evora doctor` warns of what is left, and says to run `evora migrate` again
        [found] = [
            c
            for c in await run_checks(Settings(database_url=empty_db_url))
            if c.name == "migrations"
        ]
        assert found.verdict == "warn", found
        assert f"{big[:30]}_job_times" in found.detail and "event_batches_jobs" in found.detail
        assert found.action is not None and "evora migrate" in found.action
        # and so does `evora migrate --check`, beside the old index it finds unexpected
        left = await drift(conn)
        assert any("is left to the next `evora migrate`" in line for line in left), left
        await held.rollback()
        # the next `evora migrate` builds it, attaches it and drops the old index, while a
        # writer goes on adding batches to the partition being indexed
        going, stop, written = asyncio.Event(), asyncio.Event(), list[UUID]()
        writer = asyncio.create_task(_keep_writing(empty_db_url, going, stop, written))
        await going.wait()
        assert await apply_migrations(empty_db_url) == []
        stop.set()
        await writer
        assert (
            await conn.fetchval(
                "SELECT indisvalid FROM pg_index"
                " WHERE indexrelid = 'evora.event_batches_job_times'::regclass"
            )
            is True
        )
        assert await conn.fetchval("SELECT to_regclass('evora.event_batches_jobs')") is None
        assert await conn.fetchval("SELECT count(*) FROM evora.retiring_indexes") == 0
        children = await conn.fetch(
            "SELECT c.relname, x.indisvalid FROM pg_inherits h"
            " JOIN pg_class c ON c.oid = h.inhrelid JOIN pg_index x ON x.indexrelid = c.oid"
            " WHERE h.inhparent = 'evora.event_batches_job_times'::regclass"
        )
        assert f"{big[:30]}_job_times" in {r["relname"] for r in children}
        assert all(r["indisvalid"] for r in children)
        rows, used, seq_scans = await _timeline(conn, first[7])
        assert [(r["job_id"], r["event"]) for r in rows] == [(first[7], "submitted")]
        assert "event_batches_job_times" in used and seq_scans == 0, used
        # every batch written before, during and after the build is found through the index
        for job_id in written:
            rows, used, seq_scans = await _timeline(conn, job_id)
            assert [(r["job_id"], r["event"]) for r in rows] == [(job_id, "submitted")]
            assert "event_batches_job_times" in used and seq_scans == 0
        # and again: nothing left to do
        assert await apply_migrations(empty_db_url) == []
        assert await unfinished_index_builds(conn) == []
        # the upgraded schema is the one a new installation gets
        assert await drift(conn) == []
    finally:
        await holder.close()
        await conn.close()


async def test_a_partition_detached_while_its_index_is_built_keeps_it_unattached(
    db_url: str,
) -> None:
    """Retention may detach the oldest partition while `evora migrate` builds an index on it
    (the oldest is built first): the build attaches nothing and fails nothing; the partitions
    still attached get theirs. Also a B-tree index on a column, not only migration 0066's."""
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("CREATE INDEX event_batches_test_at ON ONLY evora.event_batches (at)")
        missing = await conn.fetch(PARTITION_INDEXES_MISSING)
        partitions = await conn.fetch(
            "SELECT 'evora.' || name AS name FROM evora.event_tables()"
            " WHERE parent = 'evora.event_batches' ORDER BY upper"
        )
        assert {r["partition"] for r in missing} == {p["name"] for p in partitions}
        [gone] = [r for r in missing if r["partition"] == partitions[-1]["name"]]
        await conn.execute(f"ALTER TABLE evora.event_batches DETACH PARTITION {gone['partition']}")
        await _build_and_attach(conn, gone, wait_s=5.0)
        assert await conn.fetchval(
            "SELECT x.indisvalid FROM pg_index x WHERE x.indexrelid = to_regclass($1)"
            " AND NOT EXISTS (SELECT FROM pg_inherits h WHERE h.inhrelid = x.indexrelid)",
            gone["child"],
        )
        await build_partition_indexes(conn)
        assert await conn.fetchval(
            "SELECT indisvalid FROM pg_index"
            " WHERE indexrelid = 'evora.event_batches_test_at'::regclass"
        )
        assert await conn.fetch(PARTITION_INDEXES_MISSING) == []
        await conn.execute(f"DROP TABLE {gone['partition']}")
    finally:
        await conn.close()
