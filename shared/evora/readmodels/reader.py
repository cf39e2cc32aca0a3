"""Reading the read models of the active generation (the api's side)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo.asynchronous.database import AsyncDatabase

from evora.readmodels.layout import (
    CONTROL,
    Document,
    Generation,
    active_generation,
    checkpoint_id,
)
from evora.readmodels.stats import render_queue_stats

WORKERS_SEEN_WITHIN = timedelta(hours=24)
WORKERS_LISTED = 500

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
        as_of = {"seq": checkpoint.get("max_seq", 0), "at": checkpoint.get("at")}
        return Generation.of(self._db, number), as_of

    async def queue_stats(self, queue: str, paused: set[str]) -> dict[str, Any] | None:
        generation, as_of = await self._generation()
        doc = await generation.queues.find_one({"_id": queue})
        if doc is None:
            return None
        now = datetime.now(UTC)
        return render_queue_stats(doc, paused=queue in paused, as_of=as_of, now=now)

    async def all_queue_stats(self, paused: set[str]) -> list[dict[str, Any]]:
        generation, as_of = await self._generation()
        now = datetime.now(UTC)
        return [
            render_queue_stats(doc, paused=doc["_id"] in paused, as_of=as_of, now=now)
            async for doc in generation.queues.find({}).sort("_id", 1)
        ]

    async def workers(self) -> list[dict[str, Any]]:
        generation, _ = await self._generation()
        since = datetime.now(UTC) - WORKERS_SEEN_WITHIN
        cursor = (
            generation.workers.find({"last_seen": {"$gte": since}})
            .sort("last_seen", -1)
            .limit(WORKERS_LISTED)
        )
        return [
            {"worker_id": doc["_id"], **{f: doc.get(f) for f in _WORKER_FIELDS}}
            async for doc in cursor
        ]

    async def failures(self, queue: str) -> list[dict[str, Any]]:
        generation, _ = await self._generation()
        found = []
        async for doc in generation.failures.find({"queue": queue}).sort("type", 1):
            reasons = sorted(doc["reasons"].values(), key=lambda r: r["count"], reverse=True)
            found.append({"type": doc["type"], "failures": doc["failures"], "reasons": reasons})
        return found
