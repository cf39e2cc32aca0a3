"""Tailing the outbox into the read models of one generation.

PostgreSQL sums each batch up per queue and per worker (`read_batch`), so the projector
handles one change per document, not one object per event; only events that report an
error come one by one (their reasons are grouped here).

A batch is applied in two idempotent steps, so a projector killed at any instant and
restarted leaves the read models exactly equal to the truth:
1. queue, worker and failure documents, each advanced past only the events beyond its own
   cursor and written back by compare-and-set on that cursor;
2. the generation's checkpoint, advanced by compare-and-set;
then the consumed position is recorded in PostgreSQL (`projector_progress`), because event
retention (the sweeper, which has no MongoDB) may drop only archived events every generation
has applied. It trails the checkpoint, so a crash in between only makes retention wait.
A document already past the batch's start (written by an interrupted attempt, after which
the batch, read again, holds more events) gets the same range summed up again with only its
later events counted.
A batch costs one MongoDB write per queue, worker and (queue, type) with failures that it
touches, not one per event, sent as one bulk write per collection. The documents a batch
wrote are kept (DocumentCache), so the next batch reads only those it has not seen. A cached
copy equals the stored one as long as its cursor does (but for the fields `refresh` sets,
which batches only ever move by increments), and every write is conditional on that cursor:
a copy gone stale (another writer) fails its write and the batch is replayed with the cache
emptied. The checkpoint is kept the same way, so a batch reads nothing from MongoDB unless it
touches documents it has not written.

The checkpoint is a position in the outbox's spans (evora.storage.outbox): the snapshot
every consumed span ended at (`prev`), the span being read (`target`) and how far into it
(`cursor`: span number, xid, seq). A span's target is stored before any document holds one
of its events, so every attempt at a batch, however late, reads the same events in the
same order, and document cursors compare with the checkpoint's as (span, xid, seq).
It also holds the PostgreSQL history (system identifier, timeline) those snapshots were
taken on (`history`): read on another one, after a failover or a restore, they may count
finished xids the new primary never committed and hands out again (`HistoryChanged`), and
the generation cannot be carried on: the service rebuilds the read models instead. On a
server that refuses to tell it (HistoryCheck) batches are read without it, and the checkpoint
keeps the last one known.

What changes without an event (jobs pruned by the sweeper, delayed jobs coming due) is read
from PostgreSQL by `refresh`, which the service runs every few seconds.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import asyncpg
from bson import ObjectId
from pymongo import InsertOne, UpdateOne
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError
from pymongo.write_concern import WriteConcern

from evora.readmodels.layout import (
    CONTROL,
    STATE_NAMES,
    Document,
    Generation,
    active_generation,
    checkpoint_id,
    ensure_indexes,
)
from evora.readmodels.stats import BUCKET_SECONDS
from evora.storage.outbox import (
    NOTHING_VISIBLE,
    Batch,
    FailureEvent,
    OutboxCursor,
    Span,
    oldest_due,
    pruned_counts,
    read_batch,
)
from evora.storage.retention import (
    ABANDONED_REBUILD_SECONDS,
    projector_progress_kept,
    record_projector_progress,
)
from evora_services.projector import changes, projection
from evora_services.projector.history_check import HistoryCheck
from evora_services.projector.metrics import ProjectorMetrics

log = logging.getLogger(__name__)

BATCH_SIZE = 5000
# Queue documents refreshed per read.
REFRESH_CHUNK = 500
_REFRESH_FIELDS = dict.fromkeys(("cursor", "transitions", "pruned", "oldest_pending_at"), 1)

# A batch's checkpoint is acknowledged only once on disk (j) and, in a replica set, on a
# majority of it. MongoDB acknowledges a w:1 write before its journal reaches the disk, so one
# killed comes back without the last writes it acknowledged, while this projector, its cache
# now ahead of what is stored, goes on with the server started again. Compare-and-set finds a
# lost write out only when a later write is conditional on it: a batch's documents lost and
# its checkpoint written after the restart would pass events those documents never got, and
# a lost last checkpoint would leave an idle projector behind for good
# (tests/projector/test_mongo_crash.py).
#
# Only the checkpoint waits for the journal (and a span's target, which must outlive any
# document holding its events: see _next_batch): a journaled write returns once the journal
# (one log, written in order) is on disk up to it, so every write the same server
# acknowledged before it is on disk too, and the documents go w:1. That holds only if
# no other server took those writes: a restart, or in a replica set a new primary, in between
# loses them silently (retryable writes and reconnects hide it). So the batch (`_seal`) reads
# the server's `hello` topologyVersion (a process id, and a counter each change of role
# moves) before its first write, writes a token into the checkpoint w:1 after its last, and
# reads the topologyVersion again: the same one means one server process, primary all along,
# took every write up to the token. The journaled checkpoint is conditional on the token:
# a crash after that check loses a suffix of the journal, which contains the token if it
# contains any of the batch's writes, and the checkpoint then fails its compare-and-set. A
# server that reports no topologyVersion (before 4.4), or a mongos (whose own says nothing of
# the shards' restarts), gets every write journaled. Refreshes write w:1: each is done again
# from PostgreSQL a few seconds later.
DURABLE = WriteConcern(w="majority", j=True)
UNJOURNALED = WriteConcern(w=1)

# Documents kept between batches, per collection: a queue document with full latency
# windows holds ~60 KB in memory, so this bounds the cache at a few MB however many queues
# producers name; beyond it the least recently written are read again when touched.
CACHED_DOCUMENTS = 64


# What one document gets from a batch: a queue's or worker's summed-up change, or the
# failures of one (queue, type).
Change = TypeVar("Change")


def _past(after: OutboxCursor, docs: Iterable[Document]) -> dict[str, OutboxCursor]:
    """The documents whose cursor is beyond `after`, with that cursor."""
    past = {}
    for doc in docs:
        cursor = OutboxCursor(*projection.cursor_of(doc))
        if cursor > after:
            past[doc["_id"]] = cursor
    return past


def _unmoved(checkpoint: Document) -> Document:
    """Matches the stored checkpoint while it is still `checkpoint`: its target too, since
    fixing the target leaves the cursor as it was."""
    return {
        "_id": checkpoint["_id"],
        "cursor": checkpoint["cursor"],
        "target": checkpoint.get("target"),
    }


def position(checkpoint: Document) -> tuple[Span, OutboxCursor]:
    """Where a checkpoint stands. One written before spans, (xid, seq) read below the horizon
    in that order, becomes span 0 from the snapshot "xid:xid:" (every transaction before xid
    ended and was read) on from (xid, seq) itself, its target not fixed: read on in the same
    order, so documents written past it by an interrupted batch still compare right."""
    cursor = [int(part) for part in checkpoint["cursor"]]
    if len(cursor) == 3:
        return Span(checkpoint["prev"], checkpoint["target"]), OutboxCursor(*cursor)
    xid, seq = cursor
    if xid == 0:
        return Span(), OutboxCursor()
    return Span(f"{xid}:{xid}:"), OutboxCursor(0, xid, seq)


class ProjectionConflict(Exception):
    """A document or checkpoint changed between read and write: another writer is active.
    The batch is abandoned; replaying it from the checkpoint is safe."""


class AbandonedRebuild(Exception):
    """A rebuild's generation was taken for abandoned while it ran (its progress row removed):
    its read models may lack events removed since, so it must not become active."""


class DocumentCache:
    """The documents of one collection as this projector last wrote them, least recently
    used first, at most `limit`."""

    def __init__(self, limit: int = CACHED_DOCUMENTS) -> None:
        self._limit = limit
        self._docs: OrderedDict[Any, Document] = OrderedDict()

    def get(self, key: Any) -> Document | None:
        return self._docs.get(key)

    def put(self, docs: Iterable[Document]) -> None:
        for doc in docs:
            self._docs[doc["_id"]] = doc
            self._docs.move_to_end(doc["_id"])
        while len(self._docs) > self._limit:
            self._docs.popitem(last=False)

    def clear(self) -> None:
        self._docs.clear()


class Projector:
    def __init__(
        self,
        pool: asyncpg.Pool,
        db: AsyncDatabase[Document],
        generation: int,
        metrics: ProjectorMetrics | None = None,
        batch_size: int = BATCH_SIZE,
        history_check: HistoryCheck | None = None,
    ) -> None:
        self._pool = pool
        self._db = db
        self._metrics = metrics
        self._history_check = history_check or HistoryCheck(metrics)
        self.batch_size = batch_size
        self.generation = Generation.of(db, generation)
        self._indexed = False
        # Generations only move forward, so once this one was seen active it stays the
        # newest; until then each batch asks (a rebuild runs ahead of the switch).
        self._seen_active = False
        self._recorded = False  # whether this projector has recorded its progress yet
        self._queues = DocumentCache()
        self._workers = DocumentCache()
        self._failures = DocumentCache()
        # The checkpoint as this projector last wrote it; its next write is conditional on
        # it like the documents', so a stale one only costs a replayed batch.
        self._checkpoint: Document | None = None
        # MongoDB's topologyVersion as last seen (see UNJOURNALED), None: not read since the
        # cache was emptied. A batch that starts with one seen at the end of the previous
        # batch only asks for more: the same server throughout a longer stretch.
        self._seen_server: Document | None = None

    # -- checkpoint ----------------------------------------------------------------------

    async def checkpoint(self) -> Document:
        doc = await self._db[CONTROL].find_one({"_id": checkpoint_id(self.generation.number)})
        return doc or {
            "_id": checkpoint_id(self.generation.number),
            "cursor": [0, 0, 0],
            "prev": NOTHING_VISIBLE,
            "target": None,
            "max_seq": 0,
            "history": None,
        }

    async def _advance_checkpoint(
        self,
        old: Document,
        span: Span,
        cursor: OutboxCursor,
        batch: Batch | None,
        *,
        history: str | None,
        sealed: ObjectId | None = None,
        concern: WriteConcern = DURABLE,
    ) -> Document:
        """Replace the checkpoint `old`, still as it was (and still holding the token
        `sealed`, if given), by the position `cursor` of `span`, whose snapshots were taken
        on `history`."""
        new = {
            "_id": old["_id"],
            "cursor": [cursor.span, cursor.xid, cursor.seq],
            "prev": span.prev,
            "target": span.target,
            "history": history,
            "max_seq": max(int(old.get("max_seq", 0)), batch.max_seq if batch else 0),
            "at": datetime.now(UTC),
            "last_event_at": batch.at if batch else old.get("last_event_at"),
        }
        control = self._db[CONTROL].with_options(write_concern=concern)
        if "at" not in old:
            try:
                await control.insert_one(new)
            except Exception as exc:
                raise ProjectionConflict("checkpoint created concurrently") from exc
            return new
        found = _unmoved(old) if sealed is None else {**_unmoved(old), "sealed": sealed}
        result = await control.replace_one(found, new)
        if result.matched_count != 1:
            raise ProjectionConflict("checkpoint moved underneath, or its token was lost")
        return new

    async def _topology(self) -> Document | None:
        hello = await self._db.client.admin.command("hello")
        if hello.get("msg") == "isdbgrid":
            # a mongos answers for itself, not for the shard primaries that take the writes:
            # its topologyVersion says nothing of their restarts, so every write is journaled
            return None
        version: Document | None = hello.get("topologyVersion")
        return version

    async def _seal(self, checkpoint: Document) -> ObjectId | None:
        """After a batch's last w:1 write: a token for the checkpoint to be conditional on,
        written into it w:1, once the same server is found to have taken every write since
        `self._seen_server` was read (see UNJOURNALED). None: every write was journaled."""
        if self._seen_server is None:
            return None
        token = ObjectId()
        control = self._db[CONTROL].with_options(write_concern=UNJOURNALED)
        result = await control.update_one(_unmoved(checkpoint), {"$set": {"sealed": token}})
        if result.matched_count != 1:
            raise ProjectionConflict("checkpoint moved underneath")
        if await self._topology() != self._seen_server:
            raise ProjectionConflict("MongoDB restarted or changed primary during the batch")
        return token

    # -- one batch -----------------------------------------------------------------------

    async def run_once(self) -> int:
        """Apply the next batch; return how many events it held (0: caught up)."""
        if not self._indexed:
            await ensure_indexes(self.generation)
            self._indexed = True
        try:
            return await self._next_batch()
        except BaseException:
            # Cached copies may now be ahead of what is stored, or behind another writer.
            self._forget()
            raise

    async def _next_batch(self) -> int:
        checkpoint = self._checkpoint or await self.checkpoint()
        span, after = position(checkpoint)
        # None in a checkpoint from before histories were kept: the first batch records it
        history = checkpoint.get("history")
        batch = await self._read(span, after, history)  # HistoryChanged: on another one
        # A batch read without the history (HistoryCheck: the server refuses it) says nothing
        # of it: the checkpoint keeps the one it had. Were None stored instead, a change made
        # while the check was off would go unseen once it is on again: a read compares only
        # with a stored history, and one found where none was stored is recorded, not taken
        # for a change (no history known is no change of history).
        read_on = history if batch is None or batch.history is None else batch.history
        if batch is None:
            if span.target is None:
                return 0
            # The span's last batch was exactly full: it is done, and the next one begins.
            self._checkpoint = await self._advance_checkpoint(
                checkpoint, Span(span.target), OutboxCursor(after.span + 1), None, history=history
            )
            return await self._next_batch()
        if self._seen_server is None:  # before the batch's first write
            self._seen_server = await self._topology()
        if span.target is None:
            # Fixed, journaled, before any document holds one of its events: whoever replays
            # this batch reads the same span, so the documents' cursors compare with its
            # positions. Not w:1: a MongoDB killed right after acknowledging it loses it,
            # while the batch's documents go on to the server started again (the driver
            # reconnects) and stay until the token's check abandons the batch. The replay
            # would take a newer target, in which a transaction open at the lost one (its xid
            # below events those documents counted) comes before their cursors: never
            # counted for them (tests/projector/test_mongo_crash.py).
            span = Span(span.prev, batch.target)
            checkpoint = await self._advance_checkpoint(
                checkpoint, span, after, None, history=read_on
            )
            self._checkpoint = checkpoint
        started = time.perf_counter()
        await self._apply(span, after, batch)
        if batch.events < self.batch_size:  # the span is done
            span, upto = Span(batch.target), OutboxCursor(after.span + 1)
        else:
            upto = batch.upto
        sealed = await self._seal(checkpoint)
        self._checkpoint = await self._advance_checkpoint(
            checkpoint, span, upto, batch, history=read_on, sealed=sealed
        )
        await self._record_progress(span.prev)
        if self._metrics is not None:
            self._metrics.events.inc(batch.events)
            self._metrics.batch_size.observe(batch.events)
            self._metrics.apply_seconds.observe(time.perf_counter() - started)
            self._metrics.last_seq.set(self._checkpoint["max_seq"])
        return batch.events

    async def _read(
        self,
        span: Span,
        after: OutboxCursor,
        history: str | None,
        upto: OutboxCursor | None = None,
        past: dict[str, dict[str, OutboxCursor]] | None = None,
    ) -> Batch | None:
        async def read(conn: asyncpg.Pool | asyncpg.Connection, with_history: bool) -> Batch | None:
            return await read_batch(
                conn,
                span,
                after,
                self.batch_size,
                bucket_seconds=BUCKET_SECONDS,
                upto=upto,
                past=past,
                history=history,
                read_history=with_history,
            )

        return await self._history_check.read(self._pool, read)

    @property
    def _documents_concern(self) -> WriteConcern:
        return DURABLE if self._seen_server is None else UNJOURNALED

    def _forget(self) -> None:
        self._checkpoint = None
        self._seen_server = None
        for cache in (self._queues, self._workers, self._failures):
            cache.clear()

    async def _record_progress(self, consumed: str) -> None:
        if not self._seen_active:
            self._seen_active = await active_generation(self._db) == self.generation.number
        kept = await record_projector_progress(
            self._pool, self.generation.number, consumed, self._seen_active
        )
        if self._recorded and not kept and not self._seen_active:
            self._abandoned()
        self._recorded = True

    async def ensure_not_abandoned(self) -> None:
        """Raise AbandonedRebuild if this generation's progress row, once recorded, has been
        removed as an abandoned rebuild's (a rebuild asks before it switches: its last batches
        may have found nothing more to record)."""
        if self._recorded and not await projector_progress_kept(self._pool, self.generation.number):
            self._abandoned()

    def _abandoned(self) -> NoReturn:
        # Taken for abandoned (no progress for ABANDONED_REBUILD_SECONDS): event retention no
        # longer waited for this generation, so what it had not read may be gone.
        raise AbandonedRebuild(
            f"generation {self.generation.number} recorded no progress for"
            f" {ABANDONED_REBUILD_SECONDS:.0f} s and was taken for abandoned; events it had not"
            " read yet may have been removed since: run the rebuild again"
        )

    async def _apply(self, span: Span, after: OutboxCursor, batch: Batch) -> None:
        g = self.generation
        by_queue, by_worker = changes.fold(batch)
        queues = await self._documents(g.queues, self._queues, list(by_queue))
        workers = await self._documents(g.workers, self._workers, list(by_worker))
        # A document already past the batch's start holds some of its events (a batch
        # interrupted after writing it, then read again with more events committed): the
        # same range is summed up again with its earlier events left out for it.
        past = {"queues": _past(after, queues.values()), "workers": _past(after, workers.values())}
        if any(past.values()):
            again = await self._read(span, after, batch.history, batch.upto, past)
            assert again is not None  # the same span, the same range of it
            batch = again
            by_queue, by_worker = changes.fold(batch)
        by_failure: dict[str, list[FailureEvent]] = defaultdict(list)
        for failure in batch.failures:
            by_failure[projection.failure_key(failure.queue, failure.type)].append(failure)
        failures = await self._documents(g.failures, self._failures, list(by_failure))
        await self._project(
            g.queues,
            self._queues,
            by_queue,
            queues,
            projection.new_queue,
            projection.apply_to_queue,
        )
        await self._project(
            g.workers,
            self._workers,
            by_worker,
            workers,
            projection.new_worker,
            projection.apply_to_worker,
        )
        fresh_failures = {
            key: fresh
            for key, group in by_failure.items()
            if (fresh := projection.unseen(failures[key], group) if key in failures else group)
        }
        await self._project(
            g.failures,
            self._failures,
            fresh_failures,
            failures,
            lambda key: projection.new_failures(*key.split("\x1f", 1)),
            projection.apply_to_failures,
        )

    async def _project(
        self,
        collection: AsyncCollection[Document],
        cache: DocumentCache,
        changed: dict[str, Change],
        stored: dict[str, Document],
        new: Callable[[str], Document],
        apply: Callable[[Document, Change], Document],
    ) -> None:
        """Apply each change to its document, and write each back only if its cursor is
        still the one it had (insert: if it is still new)."""
        ops: list[InsertOne[Document] | UpdateOne] = []
        written = []
        for key, change in changed.items():
            doc = stored.get(key)
            if doc is None:
                doc = new(key)
                apply(doc, change)
                ops.append(InsertOne(doc))
            else:
                seen = doc["cursor"]
                ops.append(UpdateOne({"_id": key, "cursor": seen}, apply(doc, change)))
            written.append(doc)
        await self._write(collection, ops)
        cache.put(written)

    @staticmethod
    async def _documents(
        collection: AsyncCollection[Document], cache: DocumentCache, keys: list[str]
    ) -> dict[str, Document]:
        """The stored documents of `keys` (absent: none stored), read only where the cache
        has no copy."""
        found = {}
        missing = []
        for key in keys:
            doc = cache.get(key)
            if doc is None:
                missing.append(key)
            else:
                found[key] = doc
        if missing:
            async for doc in collection.find({"_id": {"$in": missing}}):
                found[doc["_id"]] = doc
        return found

    async def _write(
        self,
        collection: AsyncCollection[Document],
        ops: list[InsertOne[Document] | UpdateOne],
    ) -> None:
        if not ops:
            return
        try:
            result = await collection.with_options(
                write_concern=self._documents_concern
            ).bulk_write(ops, ordered=False)
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
