"""The projector's read models equal PostgreSQL's truth, whatever order, overlap or replay."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

import asyncpg
import pytest
from pymongo.asynchronous.database import AsyncDatabase

from evora.protocol.jobs import Debounce, JobSubmission
from evora.readmodels.layout import (
    CONTROL,
    TOTAL_KEYS,
    Document,
    active_generation,
    checkpoint_id,
)
from evora.readmodels.reader import ReadModels
from evora.storage.db import connect
from evora.storage.jobs import Failure, JobStore
from evora.storage.outbox import HistoryChanged
from evora.storage.retention import ABANDONED_REBUILD_SECONDS
from evora_services.projector.projector import AbandonedRebuild, ProjectionConflict, Projector
from tests.conftest import Clock
from tests.projector.conftest import catch_up, truth
from tests.projector.workload import mixed_workload

QUEUES = ["alpha", "beta", "gamma"]
VOLATILE = {"at"}


def strip(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in VOLATILE}


async def read_models(mongo: AsyncDatabase[Document], generation: int) -> dict[str, Any]:
    """Every document of a generation but for what changes with the moment of writing."""
    return {
        name: [strip(d) async for d in mongo[f"rm{generation}_{name}"].find({}).sort("_id", 1)]
        for name in ("queues", "workers", "failures")
    }


async def assert_matches_truth(
    pool: asyncpg.Pool, mongo: AsyncDatabase[Document], generation: int = 1
) -> None:
    counts, totals, newest = await truth(pool)
    checkpoint = await mongo[CONTROL].find_one({"_id": checkpoint_id(generation)})
    assert checkpoint is not None and checkpoint["max_seq"] == newest
    docs = {d["_id"]: d async for d in mongo[f"rm{generation}_queues"].find({})}
    assert set(docs) == set(totals)
    for queue, doc in docs.items():
        expected = {s: counts.get(queue, {}).get(s, 0) for s in doc["counts"]}
        assert doc["counts"] == expected, queue
        assert {k: v for k, v in doc["totals"].items() if v} == totals[queue], queue


async def test_lifecycle_is_projected(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    await mixed_workload(store, pool, jobs=300, queues=QUEUES)
    projector = Projector(pool, mongo, 1, batch_size=97)
    assert await catch_up(projector) == await pool.fetchval("SELECT count(*) FROM evora.job_events")
    await assert_matches_truth(pool, mongo)

    stats = await ReadModels(mongo).queue_stats("alpha", paused={"alpha"})
    assert stats is not None and stats["paused"] is True
    assert set(stats["totals"]) == set(TOTAL_KEYS)
    assert stats["as_of"]["seq"] == (await truth(pool))[2]
    for kind in ("wait", "run"):  # from the run_at and started_at of the events' images
        assert stats["latency_ms"][kind]["p99"] >= stats["latency_ms"][kind]["p50"] > 0
    assert stats["throughput"]["completed_per_minute"]["1m"] > 0
    workers = (await ReadModels(mongo).workers_page()).items
    claims = await pool.fetchval("SELECT count(*) FROM evora.job_events WHERE event = 'claimed'")
    assert sum(w["claimed"] for w in workers) == claims
    running = await pool.fetchval("SELECT count(*) FROM evora.jobs WHERE state = 'RUNNING'")
    assert sum(w["running"] for w in workers) == running
    failures = await ReadModels(mongo).failures("alpha")
    assert failures and all(t["reasons"] for t in failures)


async def test_replay_from_the_start_changes_nothing(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    await mixed_workload(store, pool, jobs=200, queues=QUEUES, seed=3)
    projector = Projector(pool, mongo, 1, batch_size=50)
    await catch_up(projector)
    before = {d["_id"]: d async for d in mongo["rm1_queues"].find({})}
    # forget the checkpoint, as if every batch were replayed after a crash (by a restarted
    # projector: one that has kept nothing)
    await mongo[CONTROL].update_one({"_id": checkpoint_id(1)}, {"$set": {"cursor": [0, 0]}})
    assert await catch_up(Projector(pool, mongo, 1, batch_size=50)) > 0
    after = {d["_id"]: d async for d in mongo["rm1_queues"].find({})}
    assert after == before
    await assert_matches_truth(pool, mongo)


async def test_a_batch_read_again_with_more_events_counts_each_event_once(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    """An attempt at a batch wrote its documents, then died before its checkpoint; read
    again, the batch holds more events (more had committed): the documents the attempt
    reached get only the later ones, and everything equals a projection from scratch."""
    await mixed_workload(store, pool, jobs=150, queues=QUEUES, seed=13)
    await catch_up(Projector(pool, mongo, 1, batch_size=10_000))  # one batch
    await mongo[CONTROL].delete_one({"_id": checkpoint_id(1)})  # as if never written
    await mixed_workload(store, pool, jobs=150, queues=QUEUES, seed=14)
    restarted = Projector(pool, mongo, 1, batch_size=10_000)
    assert await restarted.run_once() == await pool.fetchval(
        "SELECT count(*) FROM evora.job_events"
    )
    await restarted.refresh()
    await assert_matches_truth(pool, mongo)
    await catch_up(Projector(pool, mongo, 2, batch_size=97))
    assert await read_models(mongo, 1) == await read_models(mongo, 2)


@pytest.mark.audit_skip(reason="writes an event of a job that never exists, for the outbox")
async def test_event_committed_out_of_seq_order_is_projected(
    db_url: str, store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    projector = Projector(pool, mongo, 1)
    slow = await connect(db_url)
    try:
        tx = slow.transaction()
        await tx.start()
        await slow.execute(
            "INSERT INTO evora.job_event_rows (job_id, job_version, queue, type, event, to_state,"
            " attempt, at, job)"
            " VALUES ($1, 1, 'late', 't', 'submitted', 'PENDING', 0, now(),"
            " jsonb_populate_record(NULL::evora.job_image, '{}'))",
            uuid4(),
        )
        await store.submit(JobSubmission(queue="early", type="t"))
        await catch_up(projector)  # reads past the open transaction, without waiting for it
        early = await mongo["rm1_queues"].find_one({"_id": "early"})
        assert early is not None and early["totals"]["submitted"] == 1
        assert await mongo["rm1_queues"].find_one({"_id": "late"}) is None
        await tx.commit()
    finally:
        await slow.close()
    await catch_up(projector)
    late = await mongo["rm1_queues"].find_one({"_id": "late"})
    early = await mongo["rm1_queues"].find_one({"_id": "early"})
    assert late is not None and late["totals"]["submitted"] == 1
    assert early is not None and early["totals"]["submitted"] == 1


async def test_two_projectors_at_once_stay_exact(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    await mixed_workload(store, pool, jobs=400, queues=QUEUES, seed=11)
    conflicts = 0

    async def run(projector: Projector) -> None:
        nonlocal conflicts
        while True:
            try:
                if not await projector.run_once():
                    return
            except ProjectionConflict:
                conflicts += 1

    await asyncio.gather(
        run(Projector(pool, mongo, 1, batch_size=60)), run(Projector(pool, mongo, 1, batch_size=45))
    )
    await Projector(pool, mongo, 1).refresh()
    await assert_matches_truth(pool, mongo)


async def test_rebuild_produces_identical_read_models(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    from evora_services.projector.service import rebuild

    await mixed_workload(store, pool, jobs=250, queues=QUEUES, seed=5)
    await catch_up(Projector(pool, mongo, 1, batch_size=33))
    first = await read_models(mongo, 1)
    generation, applied = await rebuild(pool, mongo)
    assert generation == 2 and applied == await pool.fetchval(
        "SELECT count(*) FROM evora.job_events"
    )
    assert await read_models(mongo, 2) == first
    assert "rm1_queues" not in await mongo.list_collection_names()
    stats = await ReadModels(mongo).queue_stats("beta", paused=set())
    assert stats is not None and stats["counts"] == first["queues"][1]["counts"]


async def test_a_checkpoint_is_read_on_only_on_the_history_it_was_taken_on(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    """The checkpoint records the PostgreSQL history (system identifier, timeline) its
    snapshots were taken on; one from before that takes the history of its next batch. On
    another history (a promoted standby: tests/e2e/test_failover.py; here the stored one made
    another timeline) the projector raises HistoryChanged before writing anything."""
    system, timeline = await pool.fetchrow(
        "SELECT (pg_control_system()).system_identifier::text,"
        " left(pg_walfile_name(pg_current_wal_insert_lsn()), 8)"
    )
    here, elsewhere = f"{system}/{timeline}", f"{system}/{int(timeline, 16) + 1:08X}"
    control = mongo[CONTROL]
    await mixed_workload(store, pool, jobs=60, queues=QUEUES, seed=8)
    await Projector(pool, mongo, 1, batch_size=40).run_once()
    assert (await control.find_one({"_id": checkpoint_id(1)}) or {})["history"] == here

    await control.update_one({"_id": checkpoint_id(1)}, {"$unset": {"history": ""}})
    await catch_up(Projector(pool, mongo, 1, batch_size=40))
    await assert_matches_truth(pool, mongo)
    assert (await control.find_one({"_id": checkpoint_id(1)}) or {})["history"] == here

    await control.update_one({"_id": checkpoint_id(1)}, {"$set": {"history": elsewhere}})
    await mixed_workload(store, pool, jobs=20, queues=QUEUES, seed=9)
    before = await read_models(mongo, 1), await control.find_one({"_id": checkpoint_id(1)})
    with pytest.raises(HistoryChanged) as raised:
        await Projector(pool, mongo, 1).run_once()
    assert (raised.value.stored, raised.value.found) == (elsewhere, here)
    assert (await read_models(mongo, 1), await control.find_one({"_id": checkpoint_id(1)})) == (
        before
    )


async def test_failure_reasons_are_counted(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    ids = [
        s.job["id"]
        for s in await store.submit_batch(
            [JobSubmission(queue="f", type="x", max_attempts=1) for _ in range(5)]
        )
    ]
    for i, job in enumerate(await store.claim(worker_id="w", queues=["f"], max_jobs=5)):
        await store.fail(
            Failure(job["id"], job["lease_token"], "disk full" if i < 3 else "timeout", "IOError")
        )
    assert len(ids) == 5
    await catch_up(Projector(pool, mongo, 1))
    [failures] = await ReadModels(mongo).failures("f")
    assert failures["failures"] == 5
    assert [(r["message"], r["count"]) for r in failures["reasons"]] == [
        ("disk full", 3),
        ("timeout", 2),
    ]


async def test_pruned_jobs_leave_the_counts(
    store: JobStore,
    pool: asyncpg.Pool,
    mongo: AsyncDatabase[Document],
    clock: Clock,
) -> None:
    from evora.protocol.states import JobState
    from evora.storage.retention import RetentionStore

    await mixed_workload(store, pool, jobs=300, queues=QUEUES, seed=21)
    projector = Projector(pool, mongo, 1)
    await catch_up(projector)
    await clock.advance(2 * 3600)  # every finished job is past the retention below
    retention = RetentionStore(pool)
    pruned = 0
    for state in (JobState.COMPLETED, JobState.CANCELLED, JobState.DLQ):
        pruned += await retention.prune_finished(state, older_than=3600, limit=10_000)
    assert pruned > 0
    # pruning writes no event: only the prune counts tell the projector
    assert await projector.run_once() == 0
    await projector.refresh()
    await assert_matches_truth(pool, mongo)


async def test_waiting_jobs_are_counted(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    """WAITING is a state like the others in the read models: counted while a job waits,
    moved on by `dependencies_met` and by a cancellation its dependency causes."""
    parent = (await store.submit(JobSubmission(queue="alpha", type="t", max_attempts=1))).job
    for _ in range(3):
        await store.submit(JobSubmission(queue="alpha", type="t", depends_on=[parent["id"]]))
    projector = Projector(pool, mongo, 1, batch_size=97)
    await catch_up(projector)
    stats = await ReadModels(mongo).queue_stats("alpha", paused=set())
    assert stats is not None and stats["counts"]["WAITING"] == 3
    [claimed] = await store.claim(worker_id="w", queues=["alpha"], max_jobs=10)
    await store.fail(Failure(claimed["id"], claimed["lease_token"], "x", retryable=False))
    await store.discard(parent["id"])
    await catch_up(projector)
    stats = await ReadModels(mongo).queue_stats("alpha", paused=set())
    assert stats is not None
    assert (stats["counts"]["WAITING"], stats["counts"]["CANCELLED"]) == (0, 4)
    await assert_matches_truth(pool, mongo)


async def test_debounced_submissions_are_projected(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    """A `debounced` event (docs/flow-control.md) keeps its job PENDING: counted in the
    queue's totals, moving no count."""
    debounce = Debounce(key="doc", delay_seconds=0, max_delay_seconds=60)
    for n in range(3):
        await store.submit(JobSubmission(queue="alpha", type="t", payload=n, debounce=debounce))
    projector = Projector(pool, mongo, 1, batch_size=97)
    assert await catch_up(projector) == 3
    stats = await ReadModels(mongo).queue_stats("alpha", paused=set())
    assert stats is not None and stats["counts"]["PENDING"] == 1
    await assert_matches_truth(pool, mongo)


async def test_a_rebuild_taken_for_abandoned_stops_and_never_switches(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document], clock: Clock
) -> None:
    """A rebuild's generation that recorded no progress for ABANDONED_REBUILD_SECONDS has its
    progress row removed by the active projector, so that event retention stops waiting for
    it; if that rebuild was only slow, it stops at its next record or before it switches, since
    events it had not read may be gone by then. The readers stay on the active generation."""
    await mixed_workload(store, pool, jobs=60, queues=QUEUES, seed=7)
    await catch_up(Projector(pool, mongo, 1))
    slow = Projector(pool, mongo, 2, batch_size=20)
    quiet = Projector(pool, mongo, 3, batch_size=1000)
    assert await slow.run_once() > 0
    assert await quiet.run_once() > 0
    await quiet.ensure_not_abandoned()  # recorded, and its row is there

    await clock.advance(ABANDONED_REBUILD_SECONDS + 60)
    await mixed_workload(store, pool, jobs=10, queues=QUEUES, seed=8)
    await catch_up(Projector(pool, mongo, 1))
    generations = await pool.fetch("SELECT generation FROM evora.projector_progress")
    assert [r["generation"] for r in generations] == [1]

    with pytest.raises(AbandonedRebuild, match="generation 2 recorded no progress"):
        await slow.run_once()
    with pytest.raises(AbandonedRebuild, match="generation 3 recorded no progress"):
        await quiet.ensure_not_abandoned()
    assert await active_generation(mongo) == 1
