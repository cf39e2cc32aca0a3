"""Every reader of job_events by seq stays a few buffers per event without a B-tree on seq.

Migration 0059 replaced job_events' primary key (seq, at) with a BRIN index on seq. Here, on an
outbox of EVENTS events over several partitions (in transactions of TX_EVENTS, after a gap of
GAP seqs such as the partitions retention dropped leave; VACUUMed, so that the BRIN ranges are
summarized as autovacuum would have), each reader that read by seq runs as the services run
it, and what it read is its transaction's own statistics (tests/integration/
test_generic_plans.py's `read_by`): buffers of every relation of the schema and sequential
scans of job_events' partitions. Counts, not time. Through the BRIN index, `max(seq)`, a walk
`ORDER BY seq LIMIT n` and a partition's `max(seq)` read whole partitions, and a fetch by
`seq = ANY(...)` the block ranges of every partition: with the readers before 0059 on this
schema, the projector's batch read 5,215 buffers and retention's walk 2,937 with three
sequential scans (the auditor's statements before it are not these: bench/outbox_seq.py
`--tree` measures them)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage import audit as audit_module
from evora.storage.audit import audit
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.outbox import OutboxCursor, Span, read_batch
from evora_services.pipeline.events import Rectangle, between
from tests.conftest import Clock
from tests.filled import copy_of, filled_database
from tests.integration.test_generic_plans import Read, read_by

EVENTS = 300_000
TX_EVENTS = 100
GAP = 5_000_000
BATCH = 1_000
# A batch of the projector: the picking scans of job_events_tail, each event's row read as
# they find it. Measured 0.08 (the previous release's fetch by `seq = ANY(...)` through the
# BRIN index: 7).
PROJECTOR_BUFFERS_PER_EVENT = 1
# A range of seq read whole: its heap pages (about 55 events a page), the last block range of
# the newest partition (not summarized yet) and the BRIN index of every partition. Measured
# 0.02-0.03.
RANGE_BUFFERS_PER_EVENT = 0.1
# Finding the newest seq: a few ranges of 1,024 seqs; the next one past the gap: twice the
# logarithm of the gap's width in probes, each of every partition's BRIN index and of the
# first heap page that answers. Measured 120-650 and 1,300-2,100, whatever the history's size.
FIND_BUFFERS = 3_000
# Retention's look at a partition: the newest entry of its tail index, its BRIN index and the
# first page that holds a seq past the mark. Measured 29-48 for three partitions.
RETENTION_BUFFERS = 300

pytestmark = pytest.mark.audit_skip("events are inserted directly, not by transitions")

# $1 how many, $2 first of them (of EVENTS), spread from an hour ago over two and a half days:
# five partitions (the first, older than the clock, and four of a day each made ahead).
FILL = """
INSERT INTO evora.job_event_rows (job_id, job_version, queue, type, event, from_state, to_state,
                              attempt, worker_id, at, job)
SELECT gen_random_uuid(), 2, 'q', 't', 'claimed', 'PENDING', 'RUNNING', 1, 'w',
       evora.clock_now() - interval '1 hour'
           + make_interval(secs => ($2 + n) * 216000.0 / $3), i.image
FROM generate_series(1, $1) AS n,
     (SELECT evora.event_image(j, 'PENDING') AS image FROM evora.jobs j LIMIT 1) AS i
"""

# test_generic_plans.READ, with the sequential scans of job_events' partitions of more than a
# few pages only: the planner reads an empty or nearly empty one (a partition made ahead, the
# first one here) sequentially, and that is no read of the history.
READ = """
SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::int8 AS buffers,
       coalesce(sum(pg_stat_get_xact_numscans(c.oid)) FILTER (
           WHERE c.oid IN (SELECT inhrelid FROM pg_inherits
                           WHERE inhparent = 'evora.job_event_rows'::regclass)
             AND pg_relation_size(c.oid) > 8 * current_setting('block_size')::int), 0)::int8
           AS seq_scans
FROM pg_class c
WHERE c.relnamespace = 'evora'::regnamespace AND c.relkind IN ('r', 'i', 't')
"""

PAGES = """
SELECT sum(pg_relation_size(inhrelid)) / current_setting('block_size')::int FROM pg_inherits
WHERE inhparent = 'evora.job_event_rows'::regclass
"""


# The clock of every copy of the filled outbox: past its last event (ALTER DATABASE settings
# are not copied with a database, so each copy is set again).
CLOCK_SECONDS = 3 * 86_400


async def _fill(dsn: str) -> None:
    """The outbox filled and vacuumed, and the clock past it (with the sweeper's round of
    partitions, which summarizes the last block range of each partition the clock passed)."""
    pool = await create_pool(dsn, min_size=1, max_size=2)
    store = JobStore(pool)
    try:
        await store.submit(JobSubmission(queue="q", type="t"))
        async with pool.acquire() as conn:
            await conn.execute(
                "SELECT setval(pg_get_serial_sequence('evora.job_event_rows', 'seq'), $1)", GAP
            )
            for first in range(0, EVENTS, TX_EVENTS):
                async with conn.transaction():
                    await conn.execute("SET LOCAL session_replication_role = replica")
                    await conn.execute(FILL, TX_EVENTS, first, EVENTS)
            await conn.execute("VACUUM (ANALYZE) evora.job_event_rows")
    finally:
        await store.close()
        await pool.close()
    # its setting is the filled database's, not its copies'; its partitions are copied
    await Clock(dsn, dsn).advance(CLOCK_SECONDS)


@pytest.fixture(scope="module")
async def filled(pg_server_url: str, template_db: str) -> AsyncIterator[str]:
    """The outbox, filled once for the module (each test had filled its own: 12-15 s)."""
    async with filled_database(pg_server_url, template_db, _fill) as name:
        yield name


@pytest.fixture
async def db_url(pg_server_url: str, filled: str) -> AsyncIterator[str]:
    """The test's own copy of the filled outbox (retention's test writes), its clock set."""
    async with copy_of(pg_server_url, filled) as url:
        await Clock(pg_server_url, url).advance(CLOCK_SECONDS, partitions=False)
        yield url


@pytest.fixture
async def outbox(pool: asyncpg.Pool) -> asyncpg.Pool:
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(DISTINCT tableoid) FROM evora.job_event_rows") >= 4
        # one read of the outbox is above every bound here
        assert await conn.fetchval(PAGES) > FIND_BUFFERS
    return pool


async def read_by_(conn: asyncpg.Connection, operation: Awaitable[Any]) -> Read:
    return await read_by(conn, operation, READ)


def bounded(read: Read, buffers: float) -> bool:
    return read.seq_scans == 0 and read.buffers <= buffers


async def test_the_projector_fetches_its_batch_by_xid_and_seq(outbox: asyncpg.Pool) -> None:
    async with outbox.acquire() as conn:
        xid, seq = await conn.fetchrow(
            "SELECT xid::text::int8, seq FROM evora.job_events ORDER BY xid, seq OFFSET $1 LIMIT 1",
            EVENTS // 2,
        )
        after = OutboxCursor(0, xid, seq)
        batch = await read_batch(conn, Span(), after, BATCH, bucket_seconds=60)
        assert batch is not None and sum(g.events for g in batch.groups) == BATCH
        read = await read_by_(conn, read_batch(conn, Span(), after, BATCH, bucket_seconds=60))
    assert bounded(read, BATCH * PROJECTOR_BUFFERS_PER_EVENT), read


async def test_the_auditor_walks_the_history_a_range_of_seq_at_a_time(
    outbox: asyncpg.Pool,
) -> None:
    """Its statements as a bounded pass from the start runs them (the sweeper's): the first
    range, empty, the jump over the gap, the first range past it; and where a pass that read
    nothing resumes. (`first_seq_since` reads the partitions of the window it is given, which
    the audit then reads whole.)"""
    last_seq, next_seq = audit_module._LAST_SEQ, audit_module._NEXT_SEQ
    width = audit_module._EVENTS_PER_RANGE

    async def range_read(conn: asyncpg.Connection, lo: int) -> int:
        """How many events the auditor's cursor over the range from `lo` gives."""
        await conn.execute(audit_module._EVENTS, lo, lo + width, BATCH)
        count = 0
        while events := await conn.fetch(audit_module._NEXT_EVENTS):
            count += len(events)
        await conn.execute(audit_module._CLOSE_EVENTS)
        return count

    async def bounded_pass(conn: asyncpg.Connection) -> None:
        assert await range_read(conn, 2) == 0
        assert await conn.fetchval(next_seq, 2 + width) == GAP + 1
        assert await range_read(conn, GAP + 1) == BATCH

    async with outbox.acquire() as conn:
        newest = GAP + EVENTS
        assert await conn.fetchval(last_seq) == newest
        assert bounded(await read_by_(conn, conn.fetchval(last_seq)), FIND_BUFFERS)
        # across the gap before the history
        assert await conn.fetchval(next_seq, 2) == GAP + 1
        assert bounded(await read_by_(conn, conn.fetchval(next_seq, 2)), FIND_BUFFERS)
        assert await conn.fetchval(next_seq, newest + 1) is None
        # a bounded pass from the start, as the sweeper runs it: the gap, then one range
        report = await audit(conn, from_seq=2, max_events=BATCH)
        assert (report.events, report.to_seq) == (BATCH, GAP + BATCH)
        read = await read_by_(conn, bounded_pass(conn))
    assert bounded(read, FIND_BUFFERS + width * RANGE_BUFFERS_PER_EVENT), read
    assert read.buffers < await outbox.fetchval(PAGES)


async def test_the_archive_reads_ranges_of_seq(outbox: asyncpg.Pool) -> None:
    """Its rectangles' new seqs are a range (pipeline/events.py `between()`, planned with the
    bounds written in: the planner may read a partition the range covers much of
    sequentially, never the history whole), and its newest seq is evora.last_event_seq()."""
    async with outbox.acquire() as conn:
        below = await conn.fetchval("SELECT max(xid::text::int8) + 1 FROM evora.job_events")
        inner = Rectangle(GAP + EVENTS // 2, below)
        outer = Rectangle(GAP + EVENTS // 2 + 10_000, below)
        query = between(inner, outer)
        assert len(await conn.fetch(query)) == 10_000
        read = await read_by_(conn, conn.fetch(query))
        assert read.buffers < await conn.fetchval(PAGES) / 2, read
        read = await read_by_(conn, conn.fetchval("SELECT evora.last_event_seq()"))
        assert bounded(read, FIND_BUFFERS), read


async def test_retention_asks_each_partition_for_a_seq_past_the_archive(
    outbox: asyncpg.Pool,
) -> None:
    """The partitions inside the archive's watermark expire; the first beyond it stops the
    walk; none is read whole (a partition's max(seq) was)."""
    async with outbox.acquire() as conn:
        parts = await conn.fetch(
            "SELECT tableoid::regclass::text AS name, max(seq) AS last, max(xid::text::int8) AS xid"
            " FROM evora.job_event_rows GROUP BY 1 ORDER BY 2"
        )
        inside = parts[1]
        await conn.execute(
            "UPDATE evora.event_archive_watermark SET upto_seq = $1, below_xid = $2::text::xid8",
            inside["last"],
            str(parts[-1]["xid"] + 1),
        )
        await conn.execute(
            "INSERT INTO evora.projector_progress (generation, xid) VALUES (1, $1::text::xid8)",
            str(parts[-1]["xid"] + 1),
        )
        expire = "SELECT parent, name FROM evora.expired_event_tables(0, true) WHERE attached"
        expired = await conn.fetch(expire)
        rows = [r["name"] for r in expired if r["parent"] == "evora.job_event_rows"]
        assert [f"evora.{n}" for n in rows] == [p["name"] for p in parts[:2]]
        # each range goes with its (empty) twin for the batches, and no other
        twins = [r["name"] for r in expired if r["parent"] == "evora.event_batches"]
        assert twins == [n.replace("job_events_p", "event_batches_p") for n in rows]
        read = await read_by_(conn, conn.fetch(expire))
    # (the partition past the mark may be read sequentially: every row of it answers, the
    # first one ends the read)
    assert read.buffers <= RETENTION_BUFFERS, read
