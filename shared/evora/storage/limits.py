"""Concurrency and rate limits (docs/flow-control.md): defining them and reading their live
usage. The claim enforces them in the database (migration 0014); nothing here is on its path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from evora.domain.errors import LimitNotFound
from evora.storage.statements import load

PUT, DELETE, PAGE, GOVERNING, USAGE, KEYS_UNDER, USAGE_BY_KIND = load(
    "limits",
    "put_limit",
    "delete_limit",
    "list_limits",
    "governing_limit",
    "key_usage",
    "keys_under",
    "usage_by_kind",
)

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


@dataclass(frozen=True)
class KindUsage:
    """The keys of one kind (what precedes the first `:`) that live jobs hold, summed."""

    kind: str
    running: int
    tokens: float | None  # None: no key of the kind has a rate
    throttled_jobs: int
    throttled_seconds: float  # how long the longest held back has been due


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
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def _not_found(key: str) -> LimitNotFound:
    return LimitNotFound(f"no limit governs key {key!r}")


class LimitStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def put(self, key: str, spec: LimitSpec) -> tuple[LimitDict, bool]:
        """Create or replace the limit of `key`; the limit and whether it is new. Claims
        apply it from their next round: running jobs above a lowered concurrency finish."""
        rate = spec.rate
        row = await self._pool.fetchrow(
            PUT,
            key,
            spec.concurrency,
            None if rate is None else rate.limit,
            None if rate is None else rate.per_seconds,
        )
        assert row is not None  # an upsert answers its row
        return limit_from_row(row), row["created"]

    async def page(self, *, after: str | None = None, limit: int = 50) -> LimitPage:
        rows = await self._pool.fetch(PAGE, after, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        return LimitPage([limit_from_row(r) for r in rows], rows[-1]["key"] if more else None)

    async def usage(self, key: str) -> LimitDict:
        """The limit that governs `key` (its own or a prefix limit, named by `governed_by`)
        with the key's live usage. A prefix limit's own key sums the keys under its stem
        that live jobs hold."""
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(GOVERNING, key)
            if row is None:
                raise _not_found(key)
            limit = limit_from_row(row)
            if key.endswith(PREFIX_MARK):
                keys: list[str] = await conn.fetchval(KEYS_UNDER, key.removesuffix(PREFIX_MARK))
            else:
                keys = [key]
            usage = await conn.fetchrow(
                USAGE, keys, row["concurrency"], row["rate_limit"], row["rate_per_seconds"]
            )
        assert usage is not None  # an aggregate answers one row
        prefix = key.endswith(PREFIX_MARK)
        return {
            **limit,
            "key": key,
            "governed_by": row["key"],
            "running": usage["running"],
            "tokens": None if prefix else usage["tokens"],
            "throttled_jobs": usage["throttled_jobs"],
        }

    async def usage_by_kind(self) -> list[KindUsage]:
        """What metrics export: the usage of every governed key live jobs hold, by kind."""
        rows = await self._pool.fetch(USAGE_BY_KIND)
        return [
            KindUsage(
                r["kind"], r["running"], r["tokens"], r["throttled_jobs"], r["throttled_seconds"]
            )
            for r in rows
        ]

    async def delete(self, key: str) -> None:
        if await self._pool.fetchval(DELETE, key) is None:
            raise _not_found(key)
