"""What a batch writes: only the change (new latency samples appended to a bounded window,
counts moved by increments), from copies kept between batches that never outlive a change
made by another writer, and that stay bounded in number however many queues exist."""

from __future__ import annotations

import tracemalloc

import asyncpg
import pytest
from pymongo.asynchronous.database import AsyncDatabase

from evora.protocol.jobs import JobSubmission
from evora.protocol.states import JobState
from evora.readmodels.layout import Document
from evora.storage.jobs import Completion, JobStore
from evora.storage.retention import RetentionStore
from evora_services.projector import projection
from evora_services.projector.projector import ProjectionConflict, Projector
from tests.conftest import Clock
from tests.projector.conftest import catch_up
from tests.projector.test_projection import QUEUES, assert_matches_truth
from tests.projector.test_queue_sprawl import SAMPLES, sprawl
from tests.projector.workload import mixed_workload

# A queue document with full latency windows (2 x 1,000 floats) holds ~60 KB in memory:
# keeping every one of the sprawl's 610 written would retain ~37 MB; the bounded cache, 4 MB.
RETAINED_BOUND = 12 * 1024 * 1024


async def _until_caught_up(projector: Projector) -> int:
    """Run batches, counting the conflicts on the way."""
    conflicts = 0
    while True:
        try:
            if not await projector.run_once():
                return conflicts
        except ProjectionConflict:
            conflicts += 1


async def test_copies_gone_stale_under_another_writer_conflict_then_converge(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    kept = Projector(pool, mongo, 1, batch_size=60)
    await mixed_workload(store, pool, jobs=150, queues=QUEUES, seed=5)
    await catch_up(kept)
    await mixed_workload(store, pool, jobs=150, queues=QUEUES, seed=6)
    await catch_up(Projector(pool, mongo, 1))  # another writer moves everything on
    await mixed_workload(store, pool, jobs=150, queues=QUEUES, seed=8)
    # `kept` still holds the checkpoint and documents as it wrote them: its first write
    # fails, and it then reads what is stored
    assert await _until_caught_up(kept) >= 1
    await kept.refresh()
    await assert_matches_truth(pool, mongo)


async def test_counts_corrected_by_another_refresh_are_not_overwritten(
    store: JobStore,
    pool: asyncpg.Pool,
    mongo: AsyncDatabase[Document],
    clock: Clock,
) -> None:
    kept = Projector(pool, mongo, 1)
    await mixed_workload(store, pool, jobs=300, queues=QUEUES, seed=21)
    await catch_up(kept)
    await clock.advance(2 * 3600)  # every finished job is past the retention below
    retention = RetentionStore(pool)
    for state in (JobState.COMPLETED, JobState.CANCELLED, JobState.DLQ):
        await retention.prune_finished(state, older_than=3600, limit=10_000)
    await Projector(pool, mongo, 1).refresh()  # the stored counts change, the cursors do not
    await mixed_workload(store, pool, jobs=300, queues=QUEUES, seed=22)
    while await kept.run_once():  # no refresh of its own: the batches alone keep counts
        pass
    await assert_matches_truth(pool, mongo)


async def test_latency_windows_hold_the_most_recent_samples(
    store: JobStore,
    pool: asyncpg.Pool,
    mongo: AsyncDatabase[Document],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(projection, "LATENCY_SAMPLES", 25)
    projector = Projector(pool, mongo, 1)
    await store.submit_batch([JobSubmission(queue="q", type="t") for _ in range(80)])
    assert await projector.run_once() == 80
    for _ in range(4):  # a batch each: the window is appended to and trimmed 4 times
        jobs = await store.claim(worker_id="w", queues=["q"], max_jobs=20)
        await store.complete_many([Completion(j["id"], j["lease_token"], None) for j in jobs])
        assert await projector.run_once() == 40
    doc = await mongo["rm1_queues"].find_one({"_id": "q"})
    assert doc is not None
    for kind, event, since in (("wait", "claimed", "run_at"), ("run", "completed", "started_at")):
        expected = await pool.fetch(
            f"SELECT extract(epoch FROM at - (job).{since})::float8 * 1000 AS ms"
            " FROM evora.job_events WHERE event = $1 ORDER BY xid, seq",
            event,
        )
        assert doc[f"{kind}_samples"] == pytest.approx([r["ms"] for r in expected[-25:]])
        assert doc["latency_ms"][kind] == projection._percentiles(doc[f"{kind}_samples"])


async def test_documents_kept_between_batches_are_bounded(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    projector = await sprawl(store, mongo, pool)
    queues = projector.generation.queues
    await queues.update_many({}, {"$set": {"wait_samples": SAMPLES, "run_samples": SAMPLES}})
    projector = Projector(pool, mongo, 1)  # reads every document afresh, windows full
    names = [doc["_id"] async for doc in queues.find({}, {"_id": 1})]
    await store.submit_batch([JobSubmission(queue=q, type="t") for q in names])

    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        assert await projector.run_once() == len(names)  # one batch touching every queue
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < RETAINED_BOUND, after - before
