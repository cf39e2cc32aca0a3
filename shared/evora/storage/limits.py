"""Concurrency and rate limits (docs/flow-control.md): defining them and reading their live
usage. The claim enforces them in the database (evora.claim_limited(), in
storage/functions/claims_and_transitions.sql); nothing here is on its path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from evora.domain.errors import LimitNotFound
from evora.storage.statements import load

(
    PUT,
    DELETE,
    PAGE,
    GOVERNING,
    USAGE,
    PREFIX_USAGE,
    GOVERNED_KEYS,
    WAKE,
    CLOCK,
    CLAIMS_BEGUN_BEFORE,
    USAGE_BY_KIND,
    DEPTH,
    THROTTLED,
) = load(
    "limits",
    "put_limit",
    "delete_limit",
    "list_limits",
    "governing_limit",
    "key_usage",
    "prefix_usage",
    "governed_keys",
    "wake_limited_queues",
    "clock",
    "claims_begun_before",
    "usage_by_kind",
    "key_depth",
    "throttled_limits",
)

log = logging.getLogger(__name__)

# Held back jobs a usage counts at most (`throttled_jobs`: a key's, a prefix limit's summed
# over its keys, each key's of a page of governed keys; the metrics' per kind): what bounds
# the read of a backlog of any size; a count of this many means at least.
THROTTLED_COUNTED = 1_000
# PENDING jobs naming a key a limit's change reads to find the queues to wake; beyond this
# many, every queue with PENDING jobs is woken.
WAKE_READ = 1_000

# How long a PUT waits for the claims that began before its limit was committed (they are
# milliseconds long); a transaction older than that is no claim, and is not waited for.
SETTLE_SECONDS = 5.0
SETTLE_POLL_SECONDS = (0.002, 0.05)

LimitDict = dict[str, Any]

PREFIX_MARK = "*"


@dataclass(frozen=True)
class Rate:
    limit: int
    per_seconds: float


@dataclass(frozen=True)
class LimitSpec:
    concurrency: int | None
    rate: Rate | None
    # at most this many jobs holding the key waiting to run (PENDING or WAITING): admission
    # control, enforced when jobs are submitted (docs/flow-control.md, "Admission")
    max_pending: int | None = None


@dataclass(frozen=True)
class KindUsage:
    """The keys of one kind (what precedes the first `:`) that live jobs hold, summed."""

    kind: str
    running: int
    tokens: float | None  # None: no key of the kind has a rate
    throttled_jobs: int
    throttled_seconds: float  # how long the longest held back has been due


@dataclass(frozen=True)
class KeyUsage:
    """One concrete key's usage under the limit that governs it."""

    key: str
    running: int
    tokens: float | None  # None: the limit has no rate
    throttled_jobs: int
    throttled_since: datetime | None  # when the longest held back became due
    # until when an upstream throttles the key (docs/flow-control.md, "Upstream retry-after")
    throttled_until: datetime | None = None


@dataclass(frozen=True)
class KeyPage:
    limit: LimitDict
    keys: list[KeyUsage]
    next_after: str | None  # the key to pass as `after` for the next page; None at the end


@dataclass(frozen=True)
class LimitPage:
    limits: list[LimitDict]
    # the key to pass as `after` for the next page; None at the end
    next_after: str | None


def limit_from_row(row: asyncpg.Record) -> LimitDict:
    rate = (
        None
        if row["rate_limit"] is None
        else {"limit": row["rate_limit"], "per_seconds": row["rate_per_seconds"]}
    )
    return {
        "key": row["key"],
        "concurrency": row["concurrency"],
        "rate": rate,
        "max_pending": row["max_pending"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def _not_found(key: str) -> LimitNotFound:
    return LimitNotFound(f"no limit governs key {key!r}")


class LimitStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def put(self, key: str, spec: LimitSpec) -> tuple[LimitDict, bool]:
        """Create or replace the limit of `key`; the limit and whether it is new. It applies
        to every claim that begins after it is committed, and this returns only once the
        claims that began before (and may not have seen it) have ended, so a claim begun
        after the return counts every job they started. RUNNING jobs above a lowered
        concurrency finish normally; nothing more is admitted until the count is below it."""
        rate = spec.rate
        async with self._pool.acquire() as conn:
            async with conn.transaction():
                row = await conn.fetchrow(
                    PUT,
                    key,
                    spec.concurrency,
                    None if rate is None else rate.limit,
                    None if rate is None else rate.per_seconds,
                    spec.max_pending,
                )
                await conn.fetchval(WAKE, key, WAKE_READ)
            await _await_claims_begun_before(conn)
        assert row is not None  # an upsert answers its row
        return limit_from_row(row), row["created"]

    async def page(self, *, after: str | None = None, limit: int = 50) -> LimitPage:
        rows = await self._pool.fetch(PAGE, after, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        return LimitPage([limit_from_row(r) for r in rows], rows[-1]["key"] if more else None)

    async def _governing(self, conn: asyncpg.Connection, key: str) -> asyncpg.Record:
        """The limit that governs `key`: its own, else the longest prefix limit's. A prefix
        limit's key (`tenant:*`) names that limit only."""
        row = await conn.fetchrow(GOVERNING, key)
        if row is None or (key.endswith(PREFIX_MARK) and row["key"] != key):
            raise _not_found(key)
        return row

    async def usage(self, key: str) -> LimitDict:
        """The limit that governs `key` (its own or a prefix limit, named by `governed_by`)
        with the key's live usage. A prefix limit's own key sums the keys it governs (those
        under its stem without a limit of their own or a longer prefix limit) that live jobs
        hold; its `tokens` is null. Under a max_pending, a concrete key's `pending` (its jobs
        waiting to run) and `room` (how many more a submission may add now); null otherwise,
        and for a prefix limit's own key (each key under it has its own room)."""
        pending: int | None = None
        async with self._pool.acquire() as conn:
            row = await self._governing(conn, key)
            spec = (row["concurrency"], row["rate_limit"], row["rate_per_seconds"])
            if key.endswith(PREFIX_MARK):
                usage = await conn.fetchrow(
                    PREFIX_USAGE, key.removesuffix(PREFIX_MARK), *spec, THROTTLED_COUNTED
                )
            else:
                usage = await conn.fetchrow(USAGE, key, *spec, THROTTLED_COUNTED)
                if row["max_pending"] is not None:
                    pending = await conn.fetchval(DEPTH, key)
        assert usage is not None  # an aggregate answers one row
        return {
            "pending": pending,
            "room": None if pending is None else max(0, row["max_pending"] - pending),
            **limit_from_row(row),
            "key": key,
            "governed_by": row["key"],
            "running": usage["running"],
            "tokens": usage["tokens"],
            "throttled_jobs": usage["throttled_jobs"],
            "throttled_since": usage["throttled_since"],
            # a prefix limit's own key: each key under it is throttled on its own
            "throttled_until": usage.get("throttled_until"),
        }

    async def governed_keys(self, key: str, *, after: str | None, limit: int) -> KeyPage:
        """A page of the concrete keys the limit of `key` governs, with each one's usage: the
        key itself for a limit of one key, the keys under the stem for a prefix limit."""
        async with self._pool.acquire() as conn:
            row = await self._governing(conn, key)
            stem = key.removesuffix(PREFIX_MARK) if key.endswith(PREFIX_MARK) else None
            rows = await conn.fetch(
                GOVERNED_KEYS,
                key,
                stem,
                after,
                limit + 1,
                row["concurrency"],
                row["rate_limit"],
                row["rate_per_seconds"],
                THROTTLED_COUNTED,
            )
        more = len(rows) > limit
        keys = [
            KeyUsage(
                r["key"],
                r["running"],
                r["tokens"],
                r["throttled_jobs"],
                r["throttled_since"],
                r["throttled_until"],
            )
            for r in rows[:limit]
        ]
        return KeyPage(
            {**limit_from_row(row), "key": key, "governed_by": row["key"]},
            keys,
            keys[-1].key if more else None,
        )

    async def throttled_until(self) -> dict[str, datetime]:
        """By limit key (a prefix limit's for the keys under it), the latest time an
        upstream throttles a key it governs, for the limits under which one does now."""
        rows = await self._pool.fetch(THROTTLED)
        return {r["key"]: r["throttled_until"] for r in rows}

    async def usage_by_kind(self) -> list[KindUsage]:
        """What metrics export: the usage of every governed key live jobs hold, by kind."""
        rows = await self._pool.fetch(USAGE_BY_KIND, THROTTLED_COUNTED)
        return [
            KindUsage(
                r["kind"], r["running"], r["tokens"], r["throttled_jobs"], r["throttled_seconds"]
            )
            for r in rows
        ]

    async def delete(self, key: str) -> None:
        """Delete the limit of `key`; the queues whose jobs it may have held back are woken
        when it is gone."""
        async with self._pool.acquire() as conn, conn.transaction():
            if await conn.fetchval(DELETE, key) is None:
                raise _not_found(key)
            await conn.fetchval(WAKE, key, WAKE_READ)


async def _await_claims_begun_before(conn: asyncpg.Connection) -> None:
    """Waits (at most SETTLE_SECONDS) until no transaction begun in the SETTLE_SECONDS before
    now is still open: a claim that began before a limit was committed may admit jobs
    without it. Older transactions are no claims and are not waited for."""
    since = await conn.fetchval(CLOCK)
    deadline = time.monotonic() + SETTLE_SECONDS
    pause, longest = SETTLE_POLL_SECONDS
    while await conn.fetchval(CLAIMS_BEGUN_BEFORE, since, SETTLE_SECONDS):
        if time.monotonic() >= deadline:
            log.warning(
                "a transaction begun up to %.0f s before the limit was committed is still "
                "open; the limit is in force for every claim begun since, but that one may "
                "still admit jobs without it",
                SETTLE_SECONDS,
            )
            return
        await asyncio.sleep(pause)
        pause = min(pause * 2, longest)
