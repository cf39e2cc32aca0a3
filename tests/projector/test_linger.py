"""Once caught up, the projector's loop lingers before reading again, so that events arriving
in a trickle are applied in one batch instead of one batch each."""

from __future__ import annotations

import asyncio

import asyncpg
from pymongo.asynchronous.database import AsyncDatabase

from evora.http.metrics import ServiceMetrics
from evora.protocol.jobs import JobSubmission
from evora.readmodels.layout import Document
from evora.storage.jobs import JobStore
from evora_services.projector.metrics import ProjectorMetrics
from evora_services.projector.service import Linger, ProjectorService
from tests.polling import until

# Far longer than the two submits half a second apart take, so both land within it.
LINGER = 3.0


def events_seen(metrics: ServiceMetrics) -> float:
    return metrics.registry.get_sample_value("evora_projector_events_total") or 0


async def test_events_arriving_while_it_lingers_share_one_batch(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    base = ServiceMetrics("projector")
    service = ProjectorService(pool, mongo, ProjectorMetrics(base), linger=(LINGER, LINGER))
    ended = asyncio.Event()
    running = asyncio.create_task(service.lead(ended))
    try:
        await store.submit(JobSubmission(queue="q", type="t"))
        service.wake.set()
        await until(lambda: events_seen(base) >= 1, "the first event", within=30)  # then lingers
        for _ in range(2):  # half a second apart: without lingering, a batch each
            await store.submit(JobSubmission(queue="q", type="t"))
            service.wake.set()
            await asyncio.sleep(0.5)
        await until(lambda: events_seen(base) >= 3, "all three events", within=30)
    finally:
        ended.set()
        await asyncio.wait_for(running, 30)
    assert base.registry.get_sample_value("evora_projector_batch_size_count") == 2
    doc = await mongo["rm1_queues"].find_one({"_id": "q"})
    assert doc is not None and doc["counts"]["PENDING"] == 3


def test_linger_grows_while_events_keep_coming_and_is_short_after_idling() -> None:
    linger = Linger(0.005, 0.2)
    # steady traffic: every read finds events, so each batch covers more of it
    assert [linger.after_batch() for _ in range(8)] == [
        0.005,
        0.01,
        0.02,
        0.04,
        0.08,
        0.16,
        0.2,
        0.2,
    ]
    linger.idle()  # a read found nothing: the next lone event is read within 5 ms
    assert linger.seconds == 0.005
