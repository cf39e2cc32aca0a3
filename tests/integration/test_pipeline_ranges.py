"""The pipeline's JDBC read of a slice of history, cut into concurrent parts
(pipeline/events.py `between_parts()`): together the parts hold exactly the slice's events,
late transactions included, each once; and each part unfolds only the batches of its own
range of seq. A filter on seq around the whole slice's query (as Spark's `partitionColumn`
adds) reaches no index of the batches: every part would read every batch of the slice."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import Completion, JobStore
from evora_services.pipeline.events import MAX_SEQ, Rectangle, between, between_parts

PARTS = 4


async def _batches_unfolded(pool: asyncpg.Pool, query: str) -> tuple[list[int], int]:
    """The seqs `query` returns, and how many rows of event_batches its plan unfolded (the
    rows its scans of the table's partitions returned, as EXPLAIN ANALYZE counts them)."""

    def unfolded(node: dict[str, Any]) -> int:
        own = 0
        if str(node.get("Relation Name", "")).startswith("event_batches"):
            own = int(node["Actual Rows"] * node["Actual Loops"])
        return own + sum(unfolded(child) for child in node.get("Plans", []))

    seqs = [r["seq"] for r in await pool.fetch(query)]
    plan = await pool.fetchval(f"EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) {query}")
    [explained] = json.loads(plan) if isinstance(plan, str) else plan
    return seqs, unfolded(explained["Plan"])


async def _history(store: JobStore, jobs: int) -> None:
    for _ in range(jobs // 50):
        await store.submit_batch([JobSubmission(queue="q", type="t") for _ in range(50)])
    while claimed := await store.claim(worker_id="w", queues=["q"], max_jobs=25):
        await store.complete_many([Completion(j["id"], j["lease_token"]) for j in claimed])


async def test_the_parts_hold_the_slice_once_and_each_reads_its_own_batches(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    await _history(store, 1_000)
    # a transaction that takes its seqs now and commits after the archive's rectangle is
    # drawn: its events are late (seq inside the rectangle, xid outside it)
    late = await pool.acquire()
    try:
        tx = late.transaction()
        await tx.start()
        # submitted in SQL, as an application's own transaction would
        for _ in range(5):
            await late.fetchval("SELECT evora.submit('q', 't')")
        await _history(store, 500)
        archived = Rectangle(
            await pool.fetchval("SELECT evora.last_event_seq()"),
            int(await late.fetchval("SELECT pg_current_xact_id()::text")),
        )
        await tx.commit()
    finally:
        await pool.release(late)
    await _history(store, 500)
    horizon = Rectangle(MAX_SEQ, int(await pool.fetchval("SELECT pg_current_xact_id()::text")) + 1)

    for inner in (Rectangle(), archived):
        whole, whole_read = await _batches_unfolded(pool, between(inner, horizon))
        assert len(whole) == len(set(whole)) > 0
        lower, upper = min(whole), max(whole)
        parts = between_parts(inner, horizon, PARTS, lower, upper)
        assert len(parts) == PARTS
        read = []
        got: list[int] = []
        for part in parts:
            seqs, rows = await _batches_unfolded(pool, part)
            got += seqs
            read.append(rows)
        assert sorted(got) == sorted(whole)
        # each part's share of the batches, a batch at each cut read by both sides
        assert sum(read) <= whole_read + 2 * PARTS, (read, whole_read)
        if inner == Rectangle():
            # what a filter around the whole slice's query reads instead: every batch of the
            # slice, for each part (with late transactions, their read is once per slice)
            step = (upper + 1 - lower) // PARTS
            for k in range(PARTS):
                wrapped = (
                    f"SELECT * FROM ({between(inner, horizon)}) e"
                    f" WHERE seq >= {lower + step * k} AND seq < {lower + step * (k + 1)}"
                )
                assert (await _batches_unfolded(pool, wrapped))[1] >= whole_read

    # the archived rectangle's slice holds the late events: the open transaction's, and those
    # of every transaction after it that took its seqs before the rectangle was drawn
    late_events = await pool.fetchval(
        "SELECT count(*) FROM evora.job_events WHERE seq <= $1 AND xid >= $2::text::xid8",
        archived.upto_seq,
        str(archived.below_xid),
    )
    assert late_events >= 5
    whole = sorted(r["seq"] for r in await pool.fetch(between(archived, horizon)))
    assert len([seq for seq in whole if seq <= archived.upto_seq]) == late_events
    # bounds that are off (here below every seq) lose nothing and read nothing twice
    got = []
    for part in between_parts(archived, horizon, PARTS, 0, 0):
        got += [r["seq"] for r in await pool.fetch(part)]
    assert sorted(got) == whole
