"""Tailing the outbox into the read models of one generation.

A batch is applied in two idempotent steps, so a projector killed at any instant and
restarted leaves the read models exactly equal to the truth:
1. queue, worker and failure documents, each advanced past only the events beyond its own
   cursor and written back by compare-and-set on that cursor;
2. the generation's checkpoint, advanced by compare-and-set;
then the consumed position is recorded in PostgreSQL (`projector_progress`), because event
retention (the sweeper, which has no MongoDB) may drop only archived events every generation
has applied. It trails the checkpoint, so a crash in between only makes retention wait.
A batch costs one MongoDB write per queue, worker and (queue, type) with failures that it
touches, not one per event.

What changes without an event (jobs pruned by the sweeper, delayed jobs coming due) is read
from PostgreSQL by `refresh`, which the service runs every few seconds.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import asyncpg
from pymongo import InsertOne, ReplaceOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from evora.readmodels.layout import (
    CONTROL,
    STATE_NAMES,
    Document,
    Generation,
    active_generation,
    checkpoint_id,
    ensure_indexes,
)
from evora.storage.outbox import (
    OutboxCursor,
    OutboxEvent,
    oldest_due,
    pruned_counts,
    read_events,
)
from evora.storage.retention import record_projector_progress
from services.projector import projection
from services.projector.metrics import ProjectorMetrics

log = logging.getLogger(__name__)

BATCH_SIZE = 1000
# Queue documents refreshed per read.
REFRESH_CHUNK = 500
_REFRESH_FIELDS = dict.fromkeys(("cursor", "transitions", "pruned", "oldest_pending_at"), 1)

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
        # Generations only move forward, so once this one was seen active it stays the
        # newest; until then each batch asks (a rebuild runs ahead of the switch).
        self._seen_active = False

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
        await self._record_progress(events[-1])
        if self._metrics is not None:
            self._metrics.events.inc(len(events))
            self._metrics.batch_size.observe(len(events))
            self._metrics.apply_seconds.observe(time.perf_counter() - started)
            self._metrics.last_seq.set(max(checkpoint.get("max_seq", 0), *(e.seq for e in events)))
        return len(events)

    async def _record_progress(self, last: OutboxEvent) -> None:
        if not self._seen_active:
            self._seen_active = await active_generation(self._db) == self.generation.number
        await record_projector_progress(
            self._pool, self.generation.number, last.xid, last.seq, self._seen_active
        )

    async def _apply(self, events: Sequence[OutboxEvent]) -> None:
        g = self.generation
        by_queue = _group(events, lambda e: e.queue)
        queues = await self._documents(g.queues, by_queue, projection.new_queue)
        await self._compare_and_set(
            g.queues, queues, self._applied(queues, projection.apply_to_queue)
        )

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

    # -- what changes without an event -------------------------------------------------

    async def refresh(self) -> int:
        """Fold in what PostgreSQL knows and no event says: the sweeper's prune counts and
        when each queue's longest-waiting claimable job came due. Returns documents changed.
        Queues are read REFRESH_CHUNK at a time, only the fields involved, and so are their
        figures from PostgreSQL: memory does not grow with the number of queues (latency
        samples are most of a queue document)."""
        queues = self.generation.queues
        changed = 0
        after: str | None = None
        while True:
            found = {} if after is None else {"_id": {"$gt": after}}
            cursor = queues.find(found, _REFRESH_FIELDS).sort("_id", 1).limit(REFRESH_CHUNK)
            docs = [doc async for doc in cursor]
            if not docs:
                break
            after = docs[-1]["_id"]
            names = [doc["_id"] for doc in docs]
            pruned = await pruned_counts(self._pool, names)
            due = await oldest_due(self._pool, names)
            for doc in docs:
                changed += await self._refresh_one(doc, pruned.get(doc["_id"], {}), due)
        if self._metrics is not None and changed:
            self._metrics.writes.labels(queues.name).inc(changed)
        return changed

    async def _refresh_one(
        self, doc: Document, queue_pruned: dict[str, int], due: dict[str, datetime | None]
    ) -> int:
        wanted = {s: queue_pruned.get(s, 0) for s in STATE_NAMES}
        oldest = due.get(doc["_id"])
        if doc.get("pruned") == wanted and doc.get("oldest_pending_at") == oldest:
            return 0
        updated = {**doc, "pruned": wanted, "oldest_pending_at": oldest}
        projection.recount(updated)
        fields = {key: updated[key] for key in ("pruned", "oldest_pending_at", "counts")}
        result = await self.generation.queues.update_one(
            {"_id": doc["_id"], "cursor": doc["cursor"]}, {"$set": fields}
        )
        return result.matched_count


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
