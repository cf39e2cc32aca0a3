"""The projector service's answer to PostgreSQL on another history than its checkpoint's
(HistoryChanged: a failover, a restore; tests/e2e/test_failover.py makes a real one): it
rebuilds the read models into a new generation and switches readers to it, and gives the
rebuild up when it stops leading, so that it never goes on beside the next leader's."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest
from pymongo.asynchronous.database import AsyncDatabase

from evora.http.metrics import ServiceMetrics
from evora.readmodels.layout import CONTROL, Document, active_generation, checkpoint_id
from evora.storage.jobs import JobStore
from evora_services.projector.metrics import ProjectorMetrics
from evora_services.projector.projector import Projector
from evora_services.projector.service import ProjectorService, switch_generation
from tests.polling import until, waits_for_a_lock
from tests.projector.conftest import catch_up
from tests.projector.test_projection import assert_matches_truth
from tests.projector.workload import mixed_workload

QUEUES = ["alpha", "beta"]
HISTORY_CHANGES = "evora_projector_history_changes_total"


async def test_a_rebuild_on_another_history_is_given_up_when_leading_ends_and_run_again(
    store: JobStore,
    pool: asyncpg.Pool,
    mongo: AsyncDatabase[Document],
    db_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await mixed_workload(store, pool, jobs=80, queues=QUEUES, seed=11)
    await catch_up(Projector(pool, mongo, 1, batch_size=50))
    checkpoint = await mongo[CONTROL].find_one({"_id": checkpoint_id(1)})
    assert checkpoint is not None and checkpoint["target"] is None  # caught up
    system, timeline = checkpoint["history"].split("/")
    elsewhere = f"{system}/{int(timeline, 16) + 1:08X}"  # as if taken before a promotion
    await mongo[CONTROL].update_one({"_id": checkpoint_id(1)}, {"$set": {"history": elsewhere}})
    base = ServiceMetrics("projector")
    service = ProjectorService(pool, mongo, ProjectorMetrics(base))

    # The rebuild's first span target waits behind the outbox_target row a held transaction
    # has locked; generation 1's read raised HistoryChanged before taking any.
    holder = await asyncpg.connect(db_url)
    try:
        await holder.execute("BEGIN; UPDATE evora.outbox_target SET taken_at = taken_at")
        ended = asyncio.Event()
        leading = asyncio.create_task(service.lead(ended))
        await waits_for_a_lock(pool)
        ended.set()  # leadership lost mid-rebuild
        await asyncio.wait_for(leading, 60)
        # given up, not waited for: waited for, it would have failed (statement_timeout)
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
        assert base.registry.get_sample_value(HISTORY_CHANGES) == 1
        assert await active_generation(mongo) == 1
    finally:
        await holder.close()

    # Leading again: generation 1 still finds another history, and this rebuild ends.
    ended = asyncio.Event()
    leading = asyncio.create_task(service.lead(ended))
    try:

        async def switched() -> bool:
            return await active_generation(mongo) == 2

        await until(switched, "the rebuilt generation is the active one", within=60)

        async def dropped() -> bool:
            return "rm1_queues" not in await mongo.list_collection_names()

        # the switch, then the drop: leading must not end between them here (the next test)
        await until(dropped, "generation 1 dropped", within=30)
    finally:
        ended.set()
        await asyncio.wait_for(leading, 30)
    assert base.registry.get_sample_value(HISTORY_CHANGES) == 2
    await assert_matches_truth(pool, mongo, generation=2)
    rebuilt = await mongo[CONTROL].find_one({"_id": checkpoint_id(2)})
    assert rebuilt is not None and rebuilt["history"] == f"{system}/{timeline}"
    assert "rm1_queues" not in await mongo.list_collection_names()


async def test_a_generation_left_behind_by_a_leader_gone_after_the_switch_is_dropped(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    """A leader that stops leading after a rebuild's switch and before its drop leaves the old
    generation's collections behind; the next one to lead drops them before it projects."""
    await mixed_workload(store, pool, jobs=40, queues=QUEUES, seed=12)
    await catch_up(Projector(pool, mongo, 1, batch_size=50))
    await catch_up(Projector(pool, mongo, 2, batch_size=50))
    await switch_generation(mongo, 2)  # and no drop: the leader was gone
    assert "rm1_queues" in await mongo.list_collection_names()
    service = ProjectorService(pool, mongo, ProjectorMetrics(ServiceMetrics("projector")))
    ended = asyncio.Event()
    leading = asyncio.create_task(service.lead(ended))
    try:

        async def dropped() -> bool:
            return "rm1_queues" not in await mongo.list_collection_names()

        await until(dropped, "generation 1 dropped by the next leader", within=30)
    finally:
        ended.set()
        await asyncio.wait_for(leading, 30)
    assert await mongo[CONTROL].find_one({"_id": checkpoint_id(1)}) is None
    await assert_matches_truth(pool, mongo, generation=2)
