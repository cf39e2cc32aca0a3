"""The read models' MongoDB killed with SIGKILL and started again, three times, while a real
`evora projector` process tails a mixed workload: nobody restarts the projector, it carries
on when MongoDB is back, and once it has caught up the read models equal PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from pathlib import Path

import asyncpg
from pymongo import AsyncMongoClient
from pymongo.asynchronous.database import AsyncDatabase

from evora.embedded import LocalMongo
from evora.embedded._process import free_loopback_port
from evora.readmodels.layout import CONTROL, Document, checkpoint_id
from evora.storage.jobs import JobStore
from tests.polling import until
from tests.projector.conftest import truth
from tests.projector.test_crash import _start
from tests.projector.test_projection import assert_matches_truth
from tests.projector.workload import mixed_workload

KILLS = 3
OUTAGE_SECONDS = 0.5  # how long MongoDB stays down each time


async def test_sigkilled_mongodb_leaves_the_read_models_equal_to_the_truth(
    db_url: str, store: JobStore, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    server = LocalMongo(
        tmp_path / "mongo", port=free_loopback_port(), log_path=tmp_path / "mongo.log"
    )
    server.start()
    log = tmp_path / "projector.log"
    rng = random.Random(2611)
    client: AsyncMongoClient[Document] = AsyncMongoClient(server.url)
    mongo = client["crash"]
    process = _start(db_url, server.url, "crash", log)
    kills = 0

    async def progress() -> int:
        checkpoint = await mongo[CONTROL].find_one({"_id": checkpoint_id(1)})
        return int(checkpoint["max_seq"]) if checkpoint else 0

    async def killer() -> None:
        nonlocal kills
        while kills < KILLS:
            await asyncio.sleep(rng.uniform(0.3, 1.0))  # a random moment of the workload
            pid = server.pid
            assert pid is not None
            os.killpg(pid, signal.SIGKILL)
            await until(lambda: not server.running, "MongoDB is gone", within=30)
            kills += 1
            await asyncio.sleep(OUTAGE_SECONDS)
            await asyncio.to_thread(server.start)

    try:
        await asyncio.gather(
            mixed_workload(store, pool, jobs=3000, queues=["m1", "m2", "m3"], seed=5),
            killer(),
        )
        newest = (await truth(pool))[2]
        deadline = time.monotonic() + 180
        while await progress() != newest:
            assert process.poll() is None, log.read_text()[-3000:]
            if time.monotonic() >= deadline:
                raise AssertionError(
                    "projector did not catch up\n" + await _state(pool, mongo, log)
                )
            await asyncio.sleep(0.2)
        assert process.poll() is None, log.read_text()[-3000:]
        assert kills == KILLS
        try:
            await assert_matches_truth(pool, mongo)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{await _state(pool, mongo, log)}") from exc
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(20)
        await client.close()
        await asyncio.to_thread(server.stop)


async def _state(pool: asyncpg.Pool, mongo: AsyncDatabase[Document], log: Path) -> str:
    """What a failure needs to explain itself: the checkpoint against the outbox's newest
    event, each queue document's cursor and event totals against PostgreSQL's, and what the
    projector logged last."""
    _, totals, newest = await truth(pool)
    checkpoint = await mongo[CONTROL].find_one({"_id": checkpoint_id(1)})
    lines = [f"newest seq {newest}, checkpoint {checkpoint}"]
    async for doc in mongo["rm1_queues"].find({}, {"cursor": 1, "totals": 1}):
        counted = {k: v for k, v in doc["totals"].items() if v}
        lines.append(
            f"queue {doc['_id']} cursor {doc['cursor']}: totals {counted}, "
            f"truth {totals.get(doc['_id'])}"
        )
    lines.append((await asyncio.to_thread(log.read_text))[-3000:])
    return "\n".join(lines)
