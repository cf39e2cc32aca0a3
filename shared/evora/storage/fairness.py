"""Fairness weights (docs/flow-control.md, "Fairness keys"): setting them and reading what
the fair claim served each key. The claim itself is in the database (evora.claim_fair(), in
storage/functions/fairness.sql); nothing here is on its path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from evora.storage.statements import load

PUT, GET, DELETE, SHARES, BY_KIND, QUEUES, KEYS_PAGE = load(
    "fairness",
    "put_fairness_weight",
    "get_fairness_weight",
    "delete_fairness_weight",
    "fairness_shares",
    "fairness_by_kind",
    "fair_queues_summary",
    "fair_keys_page",
)

FairnessDict = dict[str, Any]


@dataclass(frozen=True)
class KeyShare:
    """What the fair claim served one key of a queue."""

    key: str
    weight: float
    served: int
    held_seconds: float
    running: int
    backlogged: bool
    lag: float


@dataclass(frozen=True)
class KindService:
    """The keys of one kind (what precedes the first `:`) in one fair queue, summed."""

    queue: str
    kind: str
    backlogged_keys: int
    waiting_jobs: int  # due PENDING
    waiting_seconds: float  # how long the longest of them has waited
    held_seconds: float  # lease seconds its ended attempts held
    served: int


@dataclass(frozen=True)
class FairQueue:
    queue: str
    keys: int
    backlogged_keys: int


@dataclass(frozen=True)
class KeyState:
    """One key of a fair queue as the dashboard shows it."""

    key: str
    weight: float
    set_by: str | None  # the key's own weight, a prefix's (`tenant:*`), or None: the default
    served: int
    running: int
    held_seconds: float
    backlogged: bool
    backlog: int  # due PENDING jobs
    longest_wait_seconds: float | None
    held_share: float | None  # of the queue's held time; None while none was held
    weight_share: float  # of the sum of the queue's keys' weights


@dataclass(frozen=True)
class KeyStatePage:
    keys: list[KeyState]
    next_after: str | None


class FairnessStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def put(self, key: str, weight: float) -> tuple[FairnessDict, bool]:
        """Set the weight of a key or prefix (`tenant:*`); whether it is new."""
        row = await self._pool.fetchrow(PUT, key, weight)
        assert row is not None
        return {"key": row["key"], "weight": row["weight"], "changed_at": row["changed_at"]}, bool(
            row["created"]
        )

    async def get(self, key: str) -> FairnessDict:
        """The weight that applies to a concrete key (or a prefix's own), with what the fair
        claim served it in each queue."""
        row = await self._pool.fetchrow(GET, key)
        assert row is not None
        return {
            "key": row["key"],
            "weight": row["weight"],
            "set_by": row["set_by"],
            "queues": row["queues"],
        }

    async def delete(self, key: str) -> bool:
        """Drop the key's own weight (it falls back to its prefix's, else 1); whether it had
        one."""
        return await self._pool.fetchval(DELETE, key) is not None

    async def shares(self, queue: str, limit: int = 100) -> list[KeyShare]:
        rows = await self._pool.fetch(SHARES, queue, limit)
        return [
            KeyShare(
                key=r["key"],
                weight=r["weight"],
                served=r["served"],
                held_seconds=r["held_seconds"],
                running=r["running"],
                backlogged=r["backlogged"],
                lag=r["lag"],
            )
            for r in rows
        ]

    async def by_kind(self) -> list[KindService]:
        """Per fair queue and kind of key, what the metrics export."""
        rows = await self._pool.fetch(BY_KIND)
        return [KindService(**dict(r)) for r in rows]

    async def queues(self) -> list[FairQueue]:
        return [FairQueue(**dict(r)) for r in await self._pool.fetch(QUEUES)]

    async def keys(self, queue: str, *, after: str | None, limit: int) -> KeyStatePage:
        """A page of the queue's keys in key order, with their state (sql/fairness.sql)."""
        rows = await self._pool.fetch(KEYS_PAGE, queue, after, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        return KeyStatePage([KeyState(**dict(r)) for r in rows], rows[-1]["key"] if more else None)
