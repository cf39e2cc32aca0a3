"""Tailing the outbox into the read models of one generation.

A batch is applied in this order, each step idempotent, so a projector killed at any
instant and restarted leaves the read models exactly equal to the truth:
1. job documents, replaced only by a newer job version;
2. queue, worker and failure documents, each advanced past only the events beyond its own
   cursor and written back by compare-and-set on that cursor;
3. the generation's checkpoint, advanced by compare-and-set.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import asyncpg
from pymongo import InsertOne, ReplaceOne, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from evora.readmodels.layout import (
    CONTROL,
    STATE_NAMES,
    Document,
    Generation,
    checkpoint_id,
    ensure_indexes,
)
from evora.storage.outbox import OutboxCursor, OutboxEvent, pruned_counts, read_events
from services.projector import projection
from services.projector.metrics import ProjectorMetrics

log = logging.getLogger(__name__)

BATCH_SIZE = 1000
_DUPLICATE_KEY = 11000

K = TypeVar("K", bound=Hashable)


class ProjectionConflict(Exception):
    """A document or checkpoint changed between read and write: another writer is active.
    The batch is abandoned; replaying it from the checkpoint is safe."""


def _group(
    events: Iterable[OutboxEvent], key: Callable[[OutboxEvent], K | None]
) -> dict[K, list[OutboxEvent]]:
    groups: dict[K, list[OutboxEvent]] = defaultdict(list)
    for event in events:
        k = key(event)
        if k is not None:
            groups[k].append(event)
    return groups


class Projector:
    def __init__(
        self,
        pool: asyncpg.Pool,
        db: AsyncDatabase[Document],
        generation: int,
        metrics: ProjectorMetrics | None = None,
        batch_size: int = BATCH_SIZE,
    ) -> None:
        self._pool = pool
        self._db = db
        self._metrics = metrics
        self._batch_size = batch_size
        self.generation = Generation.of(db, generation)
        self._indexed = False

    # -- checkpoint ----------------------------------------------------------------------

    async def checkpoint(self) -> Document:
        doc = await self._db[CONTROL].find_one({"_id": checkpoint_id(self.generation.number)})
        return doc or {"_id": checkpoint_id(self.generation.number), "cursor": [0, 0], "max_seq": 0}

    async def _advance_checkpoint(self, old: Document, events: Sequence[OutboxEvent]) -> None:
        new = {
            "_id": old["_id"],
            "cursor": [events[-1].xid, events[-1].seq],
            "max_seq": max(int(old.get("max_seq", 0)), *(e.seq for e in events)),
            "at": datetime.now(UTC),
            "last_event_at": events[-1].at,
        }
        control = self._db[CONTROL]
        if "at" not in old:
            try:
                await control.insert_one(new)
            except Exception as exc:
                raise ProjectionConflict("checkpoint created concurrently") from exc
            return
        result = await control.replace_one({"_id": old["_id"], "cursor": old["cursor"]}, new)
        if result.matched_count != 1:
            raise ProjectionConflict("checkpoint moved underneath")

    # -- one batch -----------------------------------------------------------------------

    async def run_once(self) -> int:
        """Apply the next batch; return how many events it held (0: caught up)."""
        if not self._indexed:
            await ensure_indexes(self.generation)
            self._indexed = True
        checkpoint = await self.checkpoint()
        xid, seq = checkpoint["cursor"]
        events = await read_events(self._pool, OutboxCursor(int(xid), int(seq)), self._batch_size)
        if not events:
            return 0
        started = time.perf_counter()
        await self._apply(events)
        await self._advance_checkpoint(checkpoint, events)
        if self._metrics is not None:
            self._metrics.events.inc(len(events))
            self._metrics.batch_size.observe(len(events))
            self._metrics.apply_seconds.observe(time.perf_counter() - started)
            self._metrics.last_seq.set(max(checkpoint.get("max_seq", 0), *(e.seq for e in events)))
        return len(events)

    async def _apply(self, events: Sequence[OutboxEvent]) -> None:
        g = self.generation
        await self._write_jobs(events)
        by_queue = _group(events, lambda e: e.queue)
        queues = await self._documents(g.queues, by_queue, projection.new_queue)
        pending = await self._oldest_pending(by_queue)
        updated_queues: dict[Any, Document] = {}
        for queue, (original, doc, fresh) in queues.items():
            if fresh:
                projection.apply_to_queue(doc, fresh)
            doc["oldest_pending_at"] = pending.get(queue)
            if (
                fresh
                or original is None
                or original.get("oldest_pending_at") != doc["oldest_pending_at"]
            ):
                updated_queues[queue] = doc
        await self._compare_and_set(g.queues, queues, updated_queues)

        by_worker = _group(events, lambda e: e.worker_id)
        workers = await self._documents(g.workers, by_worker, projection.new_worker)
        await self._compare_and_set(
            g.workers, workers, self._applied(workers, projection.apply_to_worker)
        )

        by_failure = _group(
            events,
            lambda e: projection.failure_key(e.queue, e.type) if projection.is_failure(e) else None,
        )
        failures = await self._documents(
            g.failures,
            by_failure,
            lambda key: projection.new_failures(*key.split("\x1f", 1)),
        )
        await self._compare_and_set(
            g.failures, failures, self._applied(failures, projection.apply_to_failures)
        )

    @staticmethod
    def _applied(
        docs: dict[Any, tuple[Document | None, Document, list[OutboxEvent]]],
        apply: Callable[[Document, Sequence[OutboxEvent]], None],
    ) -> dict[Any, Document]:
        updated = {}
        for key, (_, doc, fresh) in docs.items():
            if fresh:
                apply(doc, fresh)
                updated[key] = doc
        return updated

    async def _documents(
        self,
        collection: AsyncCollection[Document],
        groups: dict[Any, list[OutboxEvent]],
        new: Callable[[Any], Document],
    ) -> dict[Any, tuple[Document | None, Document, list[OutboxEvent]]]:
        """For each key: the stored document (None if new), a working copy, and the events
        it has not seen yet."""
        if not groups:
            return {}
        stored = {d["_id"]: d async for d in collection.find({"_id": {"$in": list(groups)}})}
        result = {}
        for key, group in groups.items():
            original = stored.get(key)
            working = _deep_copy(original) if original is not None else new(key)
            result[key] = (original, working, projection.unseen(working, group))
        return result

    async def _compare_and_set(
        self,
        collection: AsyncCollection[Document],
        docs: dict[Any, tuple[Document | None, Document, list[OutboxEvent]]],
        updated: dict[Any, Document],
    ) -> None:
        if not updated:
            return
        ops: list[InsertOne[Document] | ReplaceOne[Document]] = []
        for key, doc in updated.items():
            original = docs[key][0]
            if original is None:
                ops.append(InsertOne(doc))
            else:
                ops.append(ReplaceOne({"_id": key, "cursor": original["cursor"]}, doc))
        try:
            result = await collection.bulk_write(ops, ordered=False)
        except BulkWriteError as exc:
            raise ProjectionConflict(
                f"{collection.name}: {exc.details.get('writeErrors')}"
            ) from exc
        if result.inserted_count + result.matched_count != len(ops):
            raise ProjectionConflict(f"{collection.name}: a document moved underneath")
        if self._metrics is not None:
            self._metrics.writes.labels(collection.name).inc(len(ops))

    async def _write_jobs(self, events: Sequence[OutboxEvent]) -> None:
        """One write per job per batch: its newest version, never over a newer one."""
        newest: dict[Any, OutboxEvent] = {}
        for event in events:
            known = newest.get(event.job_id)
            if known is None or event.job_version > known.job_version:
                newest[event.job_id] = event
        ops = [
            UpdateOne(
                {"_id": str(e.job_id), "version": {"$lt": e.job_version}},
                {"$set": projection.job_document(e)},
                upsert=True,
            )
            for e in newest.values()
        ]
        try:
            await self.generation.jobs.bulk_write(ops, ordered=False)
        except BulkWriteError as exc:
            # A duplicate key means the stored job is already at this version or newer.
            errors = exc.details.get("writeErrors", [])
            if any(err.get("code") != _DUPLICATE_KEY for err in errors):
                raise
        if self._metrics is not None:
            self._metrics.writes.labels(self.generation.jobs.name).inc(len(ops))

    async def _oldest_pending(self, by_queue: dict[str, list[OutboxEvent]]) -> dict[str, Any]:
        oldest = {}
        for queue in by_queue:
            doc = await self.generation.jobs.find_one(
                {"queue": queue, "state": "PENDING"}, sort=[("run_at", 1)], projection={"run_at": 1}
            )
            oldest[queue] = doc["run_at"] if doc else None
        return oldest

    # -- pruned jobs ---------------------------------------------------------------------

    async def refresh_pruned(self) -> int:
        """Fold the sweeper's prune counts into the queue counts (pruning writes no event)."""
        pruned = await pruned_counts(self._pool)
        if not pruned:
            return 0
        changed = 0
        queues = self.generation.queues
        async for doc in queues.find({"_id": {"$in": list(pruned)}}):
            wanted = {s: pruned[doc["_id"]].get(s, 0) for s in STATE_NAMES}
            if doc.get("pruned") == wanted:
                continue
            doc["pruned"] = wanted
            projection.recount(doc)
            result = await queues.replace_one({"_id": doc["_id"], "cursor": doc["cursor"]}, doc)
            changed += result.matched_count
        return changed


def _deep_copy(doc: Document) -> Document:
    copied: Document = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            copied[key] = _deep_copy(value)
        elif isinstance(value, list):
            copied[key] = list(value)
        else:
            copied[key] = value
    return copied
