"""The outbox reader never skips an event, even one whose transaction took a lower seq but
committed after a higher one, and never waits for a transaction it does not need."""

from __future__ import annotations

import tracemalloc
from collections import Counter
from uuid import uuid4

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.readmodels.stats import BUCKET_SECONDS
from evora.storage.audit import audit
from evora.storage.db import connect
from evora.storage.jobs import Completion, Failure, JobStore
from evora.storage.outbox import NOTHING_VISIBLE, Batch, OutboxCursor, Span, read_batch
from tests.conftest import whole_event_images


async def _read(
    pool: asyncpg.Pool, cursor: OutboxCursor, limit: int, span: Span | None = None
) -> Batch | None:
    return await read_batch(pool, span or Span(), cursor, limit, bucket_seconds=BUCKET_SECONDS)


async def _drain(
    pool: asyncpg.Pool, cursor: OutboxCursor, limit: int, prev: str = NOTHING_VISIBLE
) -> list[Batch]:
    """One span from `prev` to the current snapshot, batch by batch."""
    batches: list[Batch] = []
    span = Span(prev)
    while batch := await _read(pool, cursor, limit, span):
        batches.append(batch)
        cursor, span = batch.upto, Span(prev, batch.target)
    return batches


async def _tail(pool: asyncpg.Pool) -> list[OutboxCursor]:
    """Every event's position, in reading order."""
    rows = await pool.fetch("SELECT xid::text::int8, seq FROM evora.job_events ORDER BY xid, seq")
    return [OutboxCursor(0, r[0], r[1]) for r in rows]


@pytest.mark.audit_skip(
    reason="the test writes an event of a job that never exists, to see the outbox deliver it"
)
async def test_late_commit_with_lower_seq_is_delivered(
    db_url: str, store: JobStore, pool: asyncpg.Pool
) -> None:
    slow = await connect(db_url)
    try:
        slow_tx = slow.transaction()
        await slow_tx.start()
        # The slow transaction takes its seq first...
        slow_seq = await slow.fetchval(
            "INSERT INTO evora.job_event_rows (job_id, job_version, queue, type, event, to_state,"
            " attempt,"
            " at, job) VALUES ($1, 1, 'q', 't', 'submitted', 'PENDING', 0, now(),"
            " jsonb_populate_record(NULL::evora.job_image, '{}')) RETURNING seq",
            uuid4(),
        )
        # ...then a fast one takes a higher seq and commits first.
        fast = await store.submit(JobSubmission(queue="q", type="t"))
        fast_seq = await pool.fetchval(
            "SELECT seq FROM evora.job_events WHERE job_id = $1", fast.job["id"]
        )
        assert fast_seq > slow_seq
        # A `seq > last` reader would consume fast_seq now and never look back: the span
        # to now holds it, and the slow transaction, still open, stays for a later span.
        [first] = await _drain(pool, OutboxCursor(), 100)
        assert (first.events, first.max_seq) == (1, fast_seq)
        await slow_tx.commit()
    finally:
        await slow.close()
    [late] = await _drain(pool, OutboxCursor(1), 100, first.target)
    assert (late.events, late.max_seq) == (1, slow_seq)
    assert [g.event for g in late.groups] == ["submitted"]


async def test_reader_pages_through_everything_in_order(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    for _ in range(5):
        await store.submit_batch([JobSubmission(queue="q", type="t") for _ in range(7)])
    batches = await _drain(pool, OutboxCursor(), 4)
    assert [b.events for b in batches] == [4] * 8 + [3]
    tail = await _tail(pool)
    assert [b.upto for b in batches] == tail[3::4] + tail[-1:]
    groups = [g for b in batches for g in b.groups]
    assert {(g.event, g.from_state, g.to_state) for g in groups} == {("submitted", None, "PENDING")}
    assert sum(g.events for g in groups) == 35
    # Resuming from any cursor yields exactly the rest.
    rest = await _drain(pool, tail[9], 100)
    assert [b.events for b in rest] == [25] and rest[0].upto == tail[-1]


async def test_reader_pages_through_statement_batches_from_any_cursor(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """A submission's, a claim's and a completion's events are one row of event_batches each
    (migration 0064); the reader takes them an event at a time: a page ends inside a batch
    and the next starts where it ended, and a cursor anywhere in a batch resumes with exactly
    the rest."""
    await store.submit_batch([JobSubmission(queue="q", type="t") for _ in range(10)])
    jobs = await store.claim(worker_id="w1", queues=["q"], max_jobs=10)
    await store.complete_many([Completion(j["id"], j["lease_token"]) for j in jobs[:7]])
    await store.submit(JobSubmission(queue="q", type="t"))
    assert await pool.fetchval("SELECT count(*) FROM evora.event_batches") == 4
    tail = await _tail(pool)
    assert len(tail) == 28
    batches = await _drain(pool, OutboxCursor(), 3)
    assert [b.events for b in batches] == [3] * 9 + [1]
    assert [b.upto for b in batches] == tail[2::3] + tail[-1:]
    counted: Counter[str] = Counter()
    for g in (g for b in batches for g in b.groups):
        counted[g.event] += g.events
    assert counted == {"submitted": 11, "claimed": 10, "completed": 7}
    for at in (12, 13, 19, 25):
        rest = await _drain(pool, tail[at], 100)
        assert [b.events for b in rest] == [27 - at] and rest[0].upto == tail[-1]


def _carried(image: asyncpg.Record) -> dict[str, object]:
    """The fields an event's image carries (the others are NULL)."""
    return {name: value for name, value in image.items() if value is not None}


async def test_events_after_submission_carry_only_what_readers_need(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """The `submitted` event carries the job's whole image (never the payload, result or
    progress); a later one only what readers take from an image and the event's own columns
    do not say (evora.event_image()): the due time while the job waits or runs, the
    attempt's start on a move to or from RUNNING, a FIFO group's place."""
    grouped = (await store.submit(JobSubmission(queue="q", type="t", group_key="g"))).id
    plain = (await store.submit(JobSubmission(queue="q", type="t", payload={"big": 1}))).id
    submitted_row = await pool.fetchrow("SELECT * FROM evora.jobs WHERE id = $1", plain)
    assert submitted_row is not None
    jobs = {j["id"]: j for j in await store.claim(worker_id="w1", queues=["q"], max_jobs=2)}
    await store.complete(grouped, jobs[grouped]["lease_token"], {"ok": True})
    await store.fail(Failure(plain, jobs[plain]["lease_token"], "boom", retry_in_seconds=60))
    rows = {
        r["id"]: r
        for r in await pool.fetch("SELECT * FROM evora.jobs WHERE id = ANY($1)", [grouped, plain])
    }
    events = {
        (r["job_id"], r["event"]): _carried(r["job"])
        for r in await pool.fetch("SELECT job_id, event, job FROM evora.job_events")
    }
    whole = events[(plain, "submitted")]
    assert not {"payload", "result", "progress"} & set(whole)  # the image stays small
    assert whole == {name: submitted_row[name] for name in whole}
    assert set(whole) >= {"id", "queue", "type", "state", "version", "run_at", "submit_seq"}
    place = {name: rows[grouped][name] for name in ("group_key", "priority", "submit_seq")}
    started = {"started_at": rows[grouped]["started_at"]}
    assert events[(grouped, "claimed")] == {**place, **started, "run_at": rows[grouped]["run_at"]}
    assert events[(grouped, "completed")] == {**place, **started}
    assert events[(plain, "claimed")] == {
        "run_at": submitted_row["run_at"],
        "started_at": rows[plain]["started_at"],
    }
    # back to PENDING: due again after the retry's delay
    assert events[(plain, "failed")] == {
        "run_at": rows[plain]["run_at"],
        "started_at": rows[plain]["started_at"],
    }
    # what the outbox reader takes of the images: a claim's wait, a completion's run
    [batch] = await _drain(pool, OutboxCursor(), 10)
    g, p = rows[grouped], rows[plain]
    [(waits, runs)] = batch.samples.values()
    assert sorted(waits) == pytest.approx(
        sorted(
            [
                (g["started_at"] - g["run_at"]).total_seconds() * 1000,
                (p["started_at"] - submitted_row["run_at"]).total_seconds() * 1000,
            ]
        )
    )
    assert runs == pytest.approx([(g["finished_at"] - g["started_at"]).total_seconds() * 1000])


async def test_a_history_of_whole_and_narrow_images_reads_alike(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """Jobs claimed before the upgrade (whole images) and finished after it (narrow ones):
    the outbox reader takes the same waits and run times from both, and the audit finds the
    history whole."""
    async with whole_event_images(pool):
        ids = [o.id for o in await store.submit_batch([JobSubmission(queue="q", type="t")] * 2)]
        jobs = await store.claim(worker_id="w1", queues=["q"], max_jobs=2)
    await store.complete_many([Completion(j["id"], j["lease_token"]) for j in jobs])
    await store.submit(JobSubmission(queue="q", type="t"))
    [late] = await store.claim(worker_id="w1", queues=["q"])
    await store.complete(late["id"], late["lease_token"])
    shapes = await pool.fetch(
        "SELECT event, (job).id IS NOT NULL AS whole FROM evora.job_events ORDER BY seq"
    )
    assert [(r["event"], r["whole"]) for r in shapes] == [
        *[("submitted", True)] * 2,
        *[("claimed", True)] * 2,
        *[("completed", False)] * 2,
        ("submitted", True),
        ("claimed", False),
        ("completed", False),
    ]
    rows = await pool.fetch("SELECT * FROM evora.jobs ORDER BY started_at, id")
    assert {r["id"] for r in rows} >= set(ids)
    [batch] = await _drain(pool, OutboxCursor(), 100)
    [(waits, runs)] = batch.samples.values()
    assert sorted(waits) == pytest.approx(
        sorted((r["started_at"] - r["run_at"]).total_seconds() * 1000 for r in rows)
    )
    assert sorted(runs) == pytest.approx(
        sorted((r["finished_at"] - r["started_at"]).total_seconds() * 1000 for r in rows)
    )
    async with pool.acquire() as conn:
        report = await audit(conn)
    assert report.ok and report.events == 9, report.text()


async def test_open_transaction_holds_back_nothing(
    db_url: str, store: JobStore, pool: asyncpg.Pool
) -> None:
    await store.submit(JobSubmission(queue="q", type="t"))
    blocker = await connect(db_url)
    try:
        async with blocker.transaction():
            await blocker.execute("SELECT pg_current_xact_id()")  # takes an xid, writes nothing
            await store.submit(JobSubmission(queue="q", type="t"))
            visible = await _read(pool, OutboxCursor(), 100)
            assert visible is not None and visible.events == 2
    finally:
        await blocker.close()
    after = await _read(pool, OutboxCursor(), 100)
    assert after is not None and after.events == 2


async def test_a_batch_crosses_to_the_projector_as_a_few_groups(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """1,500 events of one queue and one worker (each job submitted, claimed, completed)
    reach the projector as a handful of groups, the latency samples and no job ids (every
    job started and stopped within the batch): memory and Python work per batch do not grow
    with its events but for the samples."""
    for _ in range(5):
        await store.submit_batch([JobSubmission(queue="q", type="t") for _ in range(100)])
        claimed = await store.claim(worker_id="w", queues=["q"], max_jobs=100)
        await store.complete_many([Completion(j["id"], j["lease_token"]) for j in claimed])
    await _read(pool, OutboxCursor(), 5000)  # the statement prepared, its types known
    tracemalloc.start()
    try:
        batch = await _read(pool, OutboxCursor(), 5000)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert batch is not None and batch.events == 1500
    print(f"1,500 events: {len(batch.groups)} groups, {kept} bytes kept, peak {peak}")
    # submitted / claimed / completed, times the 10-second buckets the run spanned
    assert {(g.event, g.worker_id) for g in batch.groups} == {
        ("submitted", None),
        ("claimed", "w"),
        ("completed", "w"),
    }
    assert len(batch.groups) <= 3 * 3
    assert batch.runs == {"w": ([], [])}
    assert [len(s) for s in batch.samples["q"]] == [500, 500]
    # Measured: 47 KB kept (mostly the two lists of 500 floats), 274 KB at the peak (the
    # wire buffers). The 1,500 events read as one Python object each kept 1.13 MB.
    assert kept < 200_000 and peak < 600_000


async def test_a_new_target_is_returned_only_once_the_log_is_on_disk_past_it(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """A commit that sent only a NOTIFY took an xid but does not wait for the disk, so the
    target taken next counts it finished before a crash could still lose it (then its xid
    could be handed out again, to a transaction whose events that stored target would never
    read). read_batch returns a new target only once the log is on disk past it. On the code
    before (39d4601), the read returned at once, the NOTIFY's commit not yet on disk (3 of 3
    runs)."""
    await store.submit(JobSubmission(queue="q", type="t"))
    async with pool.acquire() as conn:
        await conn.execute("SELECT pg_notify('evora_test_only', 'x')")
        position = await conn.fetchval("SELECT pg_current_wal_insert_lsn()::text")
    batch = await _read(pool, OutboxCursor(), 100)
    assert batch is not None
    flushed = await pool.fetchval("SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn", position)
    assert flushed
    # the write whose commit put it there, for the operator to see
    assert await pool.fetchval("SELECT target::text FROM evora.outbox_target") == batch.target
    # a span whose target is fixed already writes nothing
    taken = await pool.fetchval("SELECT taken_at FROM evora.outbox_target")
    await store.submit(JobSubmission(queue="q", type="t"))
    assert await _read(pool, OutboxCursor(), 100, Span(NOTHING_VISIBLE, batch.target))
    assert await pool.fetchval("SELECT taken_at FROM evora.outbox_target") == taken
