"""A read replica: a PostgreSQL hot standby of the primary that may answer reads, and the
positions in the primary's write-ahead log that say whether it may (docs/scaling.md).

The standby has replayed the primary's log up to some position; everything committed before
that position is visible on it. A client that holds a position (one it was answered with:
after its writes the primary's, after its reads the one the answering server had reached)
may read from the standby once the standby has replayed that far, and then sees its own
writes and nothing older than what it saw before.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import asyncpg

from evora.protocol.positions import parse_position
from evora.storage.statements import load

PRIMARY_POSITION, REPLICA_POSITION = load("replica", "primary_position", "replica_position")

# How old the standby's position may be when a read is routed by it. A position only ever
# moves forward, so an older one can only send a read to the primary needlessly, never to a
# standby that lacks what the client saw; a read that needs a newer one asks again at once.
POSITION_CACHE_SECONDS = 0.05
# How often a read waiting for the standby to replay its client's position asks again.
POLL_SECONDS = 0.01
# A standby that did not answer is left alone this long (reads go to the primary), so that
# a dead or unreachable one costs one failed attempt per interval, not one per read.
DOWN_SECONDS = 1.0
# How long asking the standby for its position may take before it counts as down.
PROBE_TIMEOUT_S = 1.0


async def primary_position(pool: asyncpg.Pool) -> int:
    """The primary's position now: at or past every commit made before this call."""
    text = await pool.fetchval(PRIMARY_POSITION)
    position = parse_position(text)
    assert position is not None, text
    return position


@dataclass(frozen=True)
class ReplicaPosition:
    replayed: int | None  # None: the server is not a standby (say, promoted)
    lag: float | None  # seconds behind the primary; None: it cannot tell


class Replica:
    """The standby behind `pool`: its last known position, asked at most once at a time.

    Its lag is 0 while it has replayed everything it received. Otherwise it is the age of
    the last transaction it replayed, but no more than the time since it was last seen
    caught up: an idle primary commits nothing, so after an idle spell the last transaction
    replayed is old while the standby is only as far behind as the first new commit it has
    not replayed yet. None when it cannot tell (it has replayed no transaction since it
    started, and was never seen caught up)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self._known: ReplicaPosition | None = None
        self._known_at = -float("inf")
        self._caught_up_at: float | None = None
        self._asking: asyncio.Task[ReplicaPosition] | None = None
        self._down_until = -float("inf")

    @property
    def down(self) -> bool:
        """It failed to answer within the last DOWN_SECONDS."""
        return time.monotonic() < self._down_until

    def failed(self) -> None:
        """It failed to answer: leave it alone for DOWN_SECONDS."""
        self._down_until = time.monotonic() + DOWN_SECONDS

    async def position(self, *, max_age: float = POSITION_CACHE_SECONDS) -> ReplicaPosition:
        """Its position, asked no longer than `max_age` ago (0: asked after this call began).
        Concurrent callers share one question; raises what asking raised."""
        if self._known is not None and time.monotonic() - self._known_at <= max_age:
            return self._known
        started = time.monotonic()
        while True:
            if self._asking is None:
                self._asking = asyncio.create_task(self._ask())
            asking = self._asking
            position = await asyncio.shield(asking)
            if self._known_at >= started or max_age > 0:
                return position
            # That question was asked before this call began; ask again.

    async def _ask(self) -> ReplicaPosition:
        asked_at = time.monotonic()
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                row = await self.pool.fetchrow(REPLICA_POSITION)
        finally:
            self._asking = None
        lag: float | None = 0.0
        if row["caught_up"]:
            self._caught_up_at = asked_at
        else:
            since = None if self._caught_up_at is None else time.monotonic() - self._caught_up_at
            bounds = [age for age in (row["replay_age"], since) if age is not None]
            lag = min(bounds) if bounds else None
        replayed = None if row["replayed"] is None else parse_position(row["replayed"])
        position = ReplicaPosition(replayed, lag)
        self._known, self._known_at = position, asked_at
        return position
