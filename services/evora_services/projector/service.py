"""The projector's loop: while this replica is the active one, apply batches as fast as the
outbox fills, then wait for a NOTIFY hint or a short poll.

A batch costs about the same whether it holds 3 events or 3,000 (summed up in SQL, one
write per document), so once the loop has caught up it lingers before reading again
(`Linger`): briefly after idling, so that a lone event reaches the read models within
milliseconds, and twice as long each time the next read finds new events again, up to
LINGER_LONGEST, so that under steady traffic each batch covers that much of it, for at most
that much more lag. A full batch (a backlog) is followed at once."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

import asyncpg
from pymongo.asynchronous.database import AsyncDatabase

from evora.readmodels.layout import (
    CONTROL,
    CONTROL_ID,
    Document,
    Generation,
    active_generation,
    checkpoint_id,
)
from evora.storage.outbox import HistoryChanged, backlog
from evora.waiting import Backoff, wait_until_set
from evora_services.projector.history_check import HistoryCheck
from evora_services.projector.metrics import ProjectorMetrics
from evora_services.projector.projector import DURABLE, ProjectionConflict, Projector, position

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
REFRESH_SECONDS = 5.0
LAG_REFRESH_SECONDS = 2.0
LINGER_SHORTEST = 0.005
LINGER_LONGEST = 0.2


class Linger:
    """How long to wait before reading again after a batch that did not fill: `shortest`
    after idling, doubled by each such batch in a row, at most `longest`."""

    def __init__(self, shortest: float, longest: float) -> None:
        self._shortest = shortest
        self._longest = longest
        self.seconds = shortest

    def after_batch(self) -> float:
        """The wait after a batch that found events; the next one is twice as long."""
        seconds = self.seconds
        self.seconds = min(seconds * 2, self._longest)
        return seconds

    def idle(self) -> None:
        self.seconds = self._shortest


class ProjectorService:
    def __init__(
        self,
        pool: asyncpg.Pool,
        db: AsyncDatabase[Document],
        metrics: ProjectorMetrics,
        linger: tuple[float, float] = (LINGER_SHORTEST, LINGER_LONGEST),
    ) -> None:
        self._pool = pool
        self._db = db
        self._metrics = metrics
        self._linger = linger
        self.wake = asyncio.Event()
        self._projector: Projector | None = None
        # one for the process: a refusal is warned of once, not again by each generation
        self._history_check = HistoryCheck(metrics)

    async def _current(self) -> Projector:
        generation = await active_generation(self._db)
        if self._projector is None or self._projector.generation.number != generation:
            if self._projector is not None:
                log.info("read models switched to generation %d", generation)
            # At a switch, and when this replica starts projecting: a leader that lost its
            # lease between a rebuild's switch and its drop left the older ones behind.
            await _drop_older(self._db, generation)
            self._projector = Projector(
                self._pool, self._db, generation, self._metrics, history_check=self._history_check
            )
        return self._projector

    async def lead(self, ended: asyncio.Event) -> None:
        """Project while this replica holds the lock; return soon after `ended` is set."""
        backoff = Backoff()
        linger = Linger(*self._linger)
        next_refresh = 0.0
        next_lag = 0.0
        while not ended.is_set():
            try:
                projector = await self._current()
                # Measured before the batch too: a replica that has just taken over reports
                # how far behind it starts, not 0 until its first (perhaps long) batch is done.
                if time.monotonic() >= next_lag:
                    await self._measure_lag(projector)
                    next_lag = time.monotonic() + LAG_REFRESH_SECONDS
                try:
                    applied = await projector.run_once()
                except HistoryChanged as exc:
                    await self._rebuild(exc, ended)
                    continue
                now = time.monotonic()
                if now >= next_refresh:
                    await projector.refresh()
                    next_refresh = now + REFRESH_SECONDS
                backoff.reset()
                if applied >= projector.batch_size:
                    continue
                if applied:
                    await wait_until_set(ended, linger.after_batch())
                    continue
                linger.idle()
            except ProjectionConflict as exc:
                self._metrics.conflicts.inc()
                log.warning("batch abandoned, will replay from the checkpoint: %s", exc)
            except Exception:
                delay = backoff.next()
                log.exception("projection failed; retrying in %.1fs", delay)
                await wait_until_set(ended, delay)
                continue
            self.wake.clear()
            await _wait_any(ended, self.wake, POLL_SECONDS)
            if self.wake.is_set():
                await wait_until_set(ended, linger.seconds)
        self._metrics.queues.clear()  # a standby exports no per-queue figures
        self._metrics.unmeasured()

    async def _rebuild(self, changed: HistoryChanged, ended: asyncio.Event) -> None:
        """The active generation counted transactions on another history of PostgreSQL
        (HistoryChanged): a failover to an asynchronous standby may have lost some of them,
        whose events it counted, and handed their xids out again, whose events it would never
        read. Which they were cannot be told from the new primary, so the read models are
        rebuilt from its outbox into a new generation, which readers switch to once it has
        caught up; until then they read the old one, as it was. A lossless switchover is
        rebuilt all the same: nothing readable by a plain role tells it apart."""
        self._metrics.history_changes.inc()
        self._metrics.unmeasured()  # the lag of neither generation is measured meanwhile
        log.warning(
            "PostgreSQL's history changed under the read models (%s): a failover, switchover "
            "or restore; transactions they counted may be gone and their xids handed out "
            "again, so they are rebuilding from the outbox into a new generation",
            changed,
        )
        # Given up when this replica stops leading: the next leader finds the history
        # changed too and starts the rebuild again (its generation's collections afresh).
        rebuilding = asyncio.ensure_future(rebuild(self._pool, self._db, self._history_check))
        stopping = asyncio.ensure_future(ended.wait())
        try:
            await asyncio.wait([rebuilding, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not rebuilding.done():
                rebuilding.cancel()
                await asyncio.wait([rebuilding])
        if rebuilding.cancelled():
            return
        generation, applied = rebuilding.result()  # or what made the rebuild fail
        log.warning(
            "read models rebuilt as generation %d from %d events on %s; now active",
            generation,
            applied,
            changed.found,
        )

    async def _measure_lag(self, projector: Projector) -> None:
        checkpoint = await projector.checkpoint()
        behind = await backlog(self._pool, *position(checkpoint))
        self._metrics.events_behind.set(behind.events)
        age = 0.0
        if behind.oldest is not None:
            age = max((datetime.now(UTC) - behind.oldest).total_seconds(), 0.0)
        self._metrics.seconds_behind.set(age)
        await self._metrics.queues.update(projector.generation.queues)


async def _wait_any(first: asyncio.Event, second: asyncio.Event, seconds: float) -> None:
    waits = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()


async def _drop_older(db: AsyncDatabase[Document], generation: int) -> None:
    """Collections of generations before the active one are never read again."""
    names = await db.list_collection_names()
    for name in names:
        if name.startswith("rm") and "_" in name:
            number = name[2 : name.index("_")]
            if number.isdigit() and int(number) < generation:
                await db.drop_collection(name)
    await db[CONTROL].delete_many(
        {"_id": {"$in": [checkpoint_id(n) for n in range(1, generation)]}}
    )


async def rebuild(
    pool: asyncpg.Pool, db: AsyncDatabase[Document], history_check: HistoryCheck | None = None
) -> tuple[int, int]:
    """Project the whole outbox into a fresh generation, then make it the one readers use.
    Returns (generation, events applied). The active projector follows the switch."""
    current = await active_generation(db)
    target = current + 1
    fresh = Generation.of(db, target)
    for collection in fresh.all():
        await collection.drop()
    await db[CONTROL].delete_one({"_id": checkpoint_id(target)})
    projector = Projector(pool, db, target, history_check=history_check)
    applied = 0
    while batch := await projector.run_once():
        applied += batch
        log.info("rebuild: %d events applied", applied)
    await projector.refresh()
    await projector.ensure_not_abandoned()
    await switch_generation(db, target)
    await _drop_older(db, target)
    return target, applied


async def switch_generation(db: AsyncDatabase[Document], generation: int) -> None:
    """Make `generation` the one readers use: journaled (DURABLE), since the older ones are
    dropped next. A switch lost by a crash would send readers back to a generation with no
    collections left, and the service's projector, which follows the active generation,
    would start that one again from the beginning of an outbox retention may have thinned,
    while the rebuilt generation went unread and unfollowed."""
    control = db[CONTROL].with_options(write_concern=DURABLE)
    await control.update_one({"_id": CONTROL_ID}, {"$set": {"generation": generation}}, upsert=True)
