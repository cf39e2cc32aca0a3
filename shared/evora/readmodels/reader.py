"""Reading the read models of the active generation (the api's side)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo.asynchronous.database import AsyncDatabase

from evora.protocol.bounds import MAX_PAGE
from evora.readmodels.analytics import analytics_page, queue_types_page
from evora.readmodels.layout import (
    CONTROL,
    Document,
    Generation,
    active_generation,
    checkpoint_id,
)
from evora.readmodels.stats import (
    STATS_FIELDS,
    as_utc,
    history_fields,
    minute_of,
    render_history,
    render_queue_stats,
)

WORKERS_SEEN_WITHIN = timedelta(hours=24)
# The most workers one page holds (and, by default, the one page the first clients read).


@dataclass(frozen=True)
class Page:
    """One page of a list, and the key of its last item when more follow (None: the end)."""

    items: list[dict[str, Any]]
    next_key: list[str] | None


_WORKER_FIELDS = (
    "first_seen",
    "last_seen",
    "queues",
    "running",
    "current_jobs",
    "claimed",
    "completed",
    "failed",
    "released",
    "lease_expired",
)


class ReadModels:
    def __init__(self, db: AsyncDatabase[Document]) -> None:
        self._db = db

    async def _generation(self) -> tuple[Generation, dict[str, Any]]:
        number = await active_generation(self._db)
        checkpoint = await self._db[CONTROL].find_one({"_id": checkpoint_id(number)}) or {}
        as_of = {"seq": int(checkpoint.get("max_seq", 0)), "at": as_utc(checkpoint.get("at"))}
        return Generation.of(self._db, number), as_of

    async def queue_stats(self, queue: str, paused: set[str]) -> dict[str, Any] | None:
        generation, as_of = await self._generation()
        doc = await generation.queues.find_one({"_id": queue}, STATS_FIELDS)
        if doc is None:
            return None
        now = datetime.now(UTC)
        return render_queue_stats(doc, paused=queue in paused, as_of=as_of, now=now)

    async def queue_stats_page(
        self, paused: set[str], *, limit: int, after: str | None = None
    ) -> Page:
        """Stats of up to `limit` queues by name, those after `after`."""
        generation, as_of = await self._generation()
        now = datetime.now(UTC)
        found = {} if after is None else {"_id": {"$gt": after}}
        cursor = generation.queues.find(found, STATS_FIELDS).sort("_id", 1).limit(limit + 1)
        docs = [doc async for doc in cursor]
        return Page(
            [
                render_queue_stats(doc, paused=doc["_id"] in paused, as_of=as_of, now=now)
                for doc in docs[:limit]
            ],
            [docs[limit - 1]["_id"]] if len(docs) > limit else None,
        )

    async def queue_history(self, queue: str, minutes: int) -> dict[str, Any] | None:
        """The per-minute series of the last `minutes` minutes, up to and including the
        current one (None: the queue has not been seen)."""
        generation, _ = await self._generation()
        last = minute_of(datetime.now(UTC))
        first = last - minutes + 1
        doc = await generation.queues.find_one({"_id": queue}, history_fields(first, last))
        return None if doc is None else render_history(doc, first, minutes)

    async def history_page(self, minutes: int, *, limit: int, after: str | None = None) -> Page:
        """The same for up to `limit` queues by name, those after `after`."""
        generation, _ = await self._generation()
        last = minute_of(datetime.now(UTC))
        first = last - minutes + 1
        found = {} if after is None else {"_id": {"$gt": after}}
        cursor = (
            generation.queues.find(found, history_fields(first, last))
            .sort("_id", 1)
            .limit(limit + 1)
        )
        docs = [doc async for doc in cursor]
        return Page(
            [render_history(doc, first, minutes) for doc in docs[:limit]],
            [docs[limit - 1]["_id"]] if len(docs) > limit else None,
        )

    async def workers_page(
        self, *, limit: int = MAX_PAGE, after: tuple[datetime, str] | None = None
    ) -> Page:
        """Up to `limit` workers seen within WORKERS_SEEN_WITHIN, most recent first (ties by
        id), those after `after` (the last_seen and id of the previous page's last)."""
        generation, _ = await self._generation()
        found: dict[str, Any] = {"last_seen": {"$gte": datetime.now(UTC) - WORKERS_SEEN_WITHIN}}
        if after is not None:
            seen, worker = after
            found["$or"] = [
                {"last_seen": {"$lt": seen}},
                {"last_seen": seen, "_id": {"$gt": worker}},
            ]
        cursor = (
            generation.workers.find(found).sort([("last_seen", -1), ("_id", 1)]).limit(limit + 1)
        )
        docs = [doc async for doc in cursor]
        last = docs[limit - 1] if len(docs) > limit else None
        return Page(
            [
                {"worker_id": doc["_id"], **{f: doc.get(f) for f in _WORKER_FIELDS}}
                for doc in docs[:limit]
            ],
            None if last is None else [as_utc(last["last_seen"]).isoformat(), last["_id"]],
        )

    async def failures(self, queue: str) -> list[dict[str, Any]]:
        generation, _ = await self._generation()
        found = []
        async for doc in generation.failures.find({"queue": queue}).sort("type", 1):
            reasons = [
                {
                    **reason,
                    # reasons projected before examples were kept: the message is one
                    "example": reason.get("example", reason["message"]),
                    "job_id": reason.get("job_id"),
                    "traceback": reason.get("traceback"),
                }
                for reason in sorted(
                    doc["reasons"].values(), key=lambda r: r["count"], reverse=True
                )
            ]
            found.append({"type": doc["type"], "failures": doc["failures"], "reasons": reasons})
        return found

    async def analytics_page(
        self, *, limit: int, after: str | None = None
    ) -> tuple[dict[str, Any], Page]:
        """`evora pipeline run`'s results beside the projector's (evora.readmodels.analytics):
        the runs' `as_of` and a page of queues by name."""
        generation, as_of = await self._generation()
        header, items, last = await analytics_page(
            self._db, generation, as_of, limit=limit, after=after
        )
        return header, Page(items, None if last is None else [last])

    async def analytics_types_page(
        self, queue: str, *, limit: int, after: str | None = None
    ) -> tuple[dict[str, Any], Page]:
        """The latest run's results for each job type of `queue`, a page of types at a time."""
        header, items, last = await queue_types_page(self._db, queue, limit=limit, after=after)
        return header, Page(items, None if last is None else [last])
