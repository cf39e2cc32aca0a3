"""Producers name queues freely: the projector's per-queue work (the refresh pass, the
per-queue metrics) must not hold every queue document at once, nor export a series set that
grows with every queue ever named."""

from __future__ import annotations

import tracemalloc

import asyncpg
from pymongo.asynchronous.database import AsyncDatabase

from evora.http.metrics import ServiceMetrics
from evora.protocol.jobs import JobSubmission
from evora.readmodels.layout import Document
from evora.storage.jobs import Completion, JobStore
from evora_services.projector.metrics import EXPORTED_QUEUES_MAX, ProjectorMetrics
from evora_services.projector.projector import Projector
from evora_services.projector.service import ProjectorService
from tests.conftest import Clock
from tests.projector.conftest import catch_up

STUCK = [f"stuck-{n:02d}" for n in range(10)]  # pending jobs, no activity since
DONE = [f"done-{n:03d}" for n in range(EXPORTED_QUEUES_MAX + 100)]  # later, now empty
# A full window of latency samples per queue (what a busy queue carries).
SAMPLES = [0.5] * 1000
# Reading every document whole peaked at 56 MB here (610 queues); a chunk of fields at a
# time, at 1.2 MB.
REFRESH_PEAK_BOUND = 10 * 1024 * 1024


async def sprawl(store: JobStore, mongo: AsyncDatabase[Document], pool: asyncpg.Pool) -> Projector:
    await store.submit_batch([JobSubmission(queue=q, type="t") for q in STUCK])
    await store.submit_batch([JobSubmission(queue=q, type="t") for q in DONE])
    for start in range(0, len(DONE), 100):
        jobs = await store.claim(worker_id="w", queues=DONE[start : start + 100], max_jobs=100)
        assert len(jobs) == 100
        await store.complete_many([Completion(j["id"], j["lease_token"], None) for j in jobs])
    projector = Projector(pool, mongo, 1)
    await catch_up(projector)
    return projector


async def test_per_queue_metrics_are_capped_and_keep_queues_holding_jobs(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    projector = await sprawl(store, mongo, pool)
    metrics = ProjectorMetrics(ServiceMetrics("projector"))
    await ProjectorService(pool, mongo, metrics)._measure_lag(projector)
    samples = [(f.name, s) for f in metrics.queues.collect() for s in f.samples]
    exported = {s.labels["queue"] for name, s in samples if name == "evora_queue_jobs"}
    assert len(exported) == EXPORTED_QUEUES_MAX
    assert set(STUCK) <= exported  # the ones an alert on pending age must see
    # the most recently active of the rest fill the remaining places (completed 100 at a
    # time, the first hundred longest ago)
    assert set(DONE[200:]) <= exported and not set(DONE[:100]) & exported
    [omitted] = [s.value for name, s in samples if name == "evora_queue_series_omitted"]
    assert omitted == len(STUCK) + len(DONE) - EXPORTED_QUEUES_MAX


async def test_refresh_reads_queue_documents_a_chunk_of_fields_at_a_time(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document], clock: Clock
) -> None:
    projector = await sprawl(store, mongo, pool)
    queues = projector.generation.queues
    await queues.update_many({}, {"$set": {"wait_samples": SAMPLES, "run_samples": SAMPLES}})
    await clock.advance(60)  # the pending jobs have waited a minute longer

    tracemalloc.start()
    try:
        changed = await projector.refresh()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert changed == len(STUCK)  # their oldest pending job aged
    assert peak < REFRESH_PEAK_BOUND, peak
    stuck = await queues.find_one({"_id": STUCK[0]})
    assert stuck is not None and stuck["wait_samples"] == SAMPLES  # left as they were
    assert stuck["counts"]["PENDING"] == 1
