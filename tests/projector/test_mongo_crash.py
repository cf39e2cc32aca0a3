"""The read models' MongoDB killed with SIGKILL and started again, three times, while a real
`evora projector` process tails a mixed workload: nobody restarts the projector, it carries
on when MongoDB is back, and once it has caught up the read models equal PostgreSQL. Then
killed right after the writes whose loss did harm when MongoDB acknowledged them before
they were on disk: a batch's first documents, and the last checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest
from bson import ObjectId
from pymongo import AsyncMongoClient, InsertOne, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from evora.embedded import LocalMongo
from evora.embedded._process import free_loopback_port
from evora.protocol.jobs import JobSubmission
from evora.readmodels.client import mongo_client
from evora.readmodels.layout import CONTROL, Document, active_generation, checkpoint_id
from evora.storage.jobs import JobStore
from evora.storage.outbox import Batch, OutboxCursor, Span
from evora_services.projector import service
from evora_services.projector.projector import Projector
from tests.polling import until
from tests.projector.conftest import catch_up, catch_up_replaying, truth
from tests.projector.test_crash import _start
from tests.projector.test_projection import assert_matches_truth
from tests.projector.workload import mixed_workload

KILLS = 3
OUTAGE_SECONDS = 0.5  # how long MongoDB stays down each time

T = TypeVar("T")


@contextlib.asynccontextmanager
async def _killable_mongo(
    tmp_path: Path, name: str
) -> AsyncIterator[tuple[LocalMongo, AsyncDatabase[Document]]]:
    """A MongoDB of the test's own, which it may kill, and database `name` in it."""
    server = LocalMongo(tmp_path / "mongo", port=free_loopback_port())
    server.start()
    client = mongo_client(server.url, "test")
    try:
        yield server, client[name]
    finally:
        await client.close()
        await asyncio.to_thread(server.stop)


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


class _KillsMongo(Projector):
    """A projector whose MongoDB is SIGKILLed, and started again, the moment it has
    acknowledged its `nth` write of the queue documents (`what` "queues") or of the
    checkpoint ("checkpoint"). Everything before that write is made durable first (fsync),
    so that the crash can lose that write and no other. Or ("sealed") killed once its `nth`
    batch has found that one server took all its writes, just before the checkpoint, with
    nothing made durable: the crash loses the batch's writes, w:1 since the last journaled
    one."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        db: AsyncDatabase[Document],
        server: LocalMongo,
        what: str,
        nth: int,
    ) -> None:
        super().__init__(pool, db, 1, batch_size=100)
        self._server = server
        self._what = what
        self._left = nth

    def _due(self, what: str) -> bool:
        if what == self._what:
            self._left -= 1
        return what == self._what and self._left == 0

    async def _crash_after(self, write: Awaitable[T]) -> T:
        return await _crash_after(self._db, self._server, write)

    async def _write(
        self, collection: AsyncCollection[Document], ops: list[InsertOne[Document] | UpdateOne]
    ) -> None:
        write = super()._write(collection, ops)
        if collection.name.endswith("_queues") and self._due("queues"):
            await self._crash_after(write)
        else:
            await write

    async def _advance_checkpoint(
        self,
        old: Document,
        span: Span,
        cursor: OutboxCursor,
        batch: Batch | None,
        **how: Any,
    ) -> Document:
        write = super()._advance_checkpoint(old, span, cursor, batch, **how)
        return await (self._crash_after(write) if self._due("checkpoint") else write)

    async def _seal(self, checkpoint: Document) -> ObjectId | None:
        token = await super()._seal(checkpoint)
        if self._due("sealed"):
            await _kill(self._server)
        return token


async def test_a_batch_whose_first_writes_mongodb_lost_is_not_checkpointed(
    store: JobStore, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """MongoDB killed between a batch's writes loses those it acknowledged unless they were
    journaled, while the rest of the batch, its checkpoint included, goes to the server
    started again and stays. The checkpoint must not pass events whose documents were
    lost: once caught up, the queue documents hold every event."""
    async with _killable_mongo(tmp_path, "lost") as (server, db):
        await mixed_workload(store, pool, jobs=300, queues=["k1", "k2"], seed=23)
        await catch_up_replaying(_KillsMongo(pool, db, server, "queues", nth=5))
        await assert_matches_truth(pool, db)


async def test_a_batch_lost_after_its_server_was_checked_is_not_checkpointed(
    store: JobStore, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """A batch's documents go w:1 and only its checkpoint is journaled. MongoDB killed after
    the batch found one server took all its writes, and before the checkpoint, loses those
    documents, while the checkpoint goes to the server started again: it must not pass their
    events. The third batch is one in the middle of a span, whose checkpoint position is
    already durable."""
    async with _killable_mongo(tmp_path, "lost") as (server, db):
        await mixed_workload(store, pool, jobs=300, queues=["s1", "s2"], seed=37)
        await catch_up_replaying(_KillsMongo(pool, db, server, "sealed", nth=3))
        await assert_matches_truth(pool, db)


class _LosesTarget(Projector):
    """A projector whose MongoDB is SIGKILLed, and started again, the moment it has
    acknowledged the checkpoint write that fixes a span's target (everything before it made
    durable first), and then runs `meanwhile`."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        db: AsyncDatabase[Document],
        server: LocalMongo,
        meanwhile: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(pool, db, 1)
        self._server = server
        self._meanwhile: Callable[[], Awaitable[None]] | None = meanwhile

    async def _advance_checkpoint(
        self,
        old: Document,
        span: Span,
        cursor: OutboxCursor,
        batch: Batch | None,
        **how: Any,
    ) -> Document:
        write = super()._advance_checkpoint(old, span, cursor, batch, **how)
        fixes_target = batch is None and span.target is not None and old.get("target") is None
        if not fixes_target or self._meanwhile is None:
            return await write
        meanwhile, self._meanwhile = self._meanwhile, None
        written = await _crash_after(self._db, self._server, write)
        await meanwhile()
        return written


async def test_a_span_target_lost_by_mongodb_is_not_read_past_by_documents(
    db_url: str, store: JobStore, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """A span's target is stored in the checkpoint before any document holds one of its
    events, so that a batch read again reads the same span. MongoDB killed right after
    acknowledging that write loses it unless it was journaled, while the batch's documents
    go to the server started again and stay. A transaction open when the lost target was
    taken (its xid the smallest) commits meanwhile: the batch read again takes a new target,
    which holds it, before the events the documents already counted. Its event must still
    be counted."""
    held = await asyncpg.connect(db_url)
    try:
        tx = held.transaction()
        await tx.start()
        await held.fetchval("SELECT evora.submit('t1', 'held', '{}', '{}')")
        await store.submit_batch([JobSubmission(queue="t1", type="t") for _ in range(20)])
        async with _killable_mongo(tmp_path, "target") as (server, db):
            await catch_up_replaying(_LosesTarget(pool, db, server, tx.commit))
            await assert_matches_truth(pool, db)
    finally:
        await held.close()


async def test_the_last_checkpoint_before_mongodb_is_killed_is_kept(
    store: JobStore, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    """A projector that has caught up reads nothing more from MongoDB until new events come:
    had MongoDB lost its last checkpoint, acknowledged just before being killed, the read
    models would stay behind, the projector idle and sure it is done. Here the last batch
    (one span: its target, then the span done) is read with MongoDB killed right after that
    second checkpoint write."""
    async with _killable_mongo(tmp_path, "lost") as (server, db):
        projector = _KillsMongo(pool, db, server, "checkpoint", nth=2)
        await store.submit_batch([JobSubmission(queue="c1", type="t") for _ in range(20)])
        assert await catch_up(projector) == 20
        await assert_matches_truth(pool, db)


async def test_a_rebuilds_switch_is_kept_when_mongodb_is_killed_right_after_it(
    store: JobStore, pool: asyncpg.Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild makes its generation the one readers use, then drops the older ones. Had
    MongoDB lost that switch, acknowledged just before being killed, readers would be sent
    back to generation 1, whose collections and checkpoint the rebuild goes on to drop, and
    the service's projector, following the active generation, would start generation 1 again
    from an outbox whose old events retention may have dropped, leaving the rebuilt
    generation unread and unfollowed."""
    switch = service.switch_generation
    async with _killable_mongo(tmp_path, "flip") as (server, db):

        async def switch_then_crash(db: AsyncDatabase[Document], generation: int) -> None:
            await _crash_after(db, server, switch(db, generation))

        monkeypatch.setattr(service, "switch_generation", switch_then_crash)
        await mixed_workload(store, pool, jobs=200, queues=["g1", "g2"], seed=31)
        await catch_up(Projector(pool, db, 1))
        assert (await service.rebuild(pool, db))[0] == 2
        assert await active_generation(db) == 2
        await assert_matches_truth(pool, db, generation=2)


async def _crash_after(db: AsyncDatabase[Document], server: LocalMongo, write: Awaitable[T]) -> T:
    """`write`'s result, MongoDB SIGKILLed the moment it has acknowledged it and started
    again. Everything before that write is made durable first (fsync), so that the crash can
    lose that write and no other."""
    await db.client.admin.command("fsync")
    written = await write
    await _kill(server)
    return written


async def _kill(server: LocalMongo) -> None:
    """SIGKILL MongoDB, and start it again."""
    pid = server.pid
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    await until(lambda: not server.running, "MongoDB is gone", within=30)
    await asyncio.to_thread(server.start)


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
