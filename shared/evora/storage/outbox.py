"""Gap-free reading of the `job_events` outbox (rule 5 of docs/architecture.md), for the
projector and pipeline.

Sequence numbers are taken at insert but become visible at commit, so `seq > last` can skip
an event whose transaction commits after a later one. Events are instead read in
(xid, seq) order and only from transactions older than the oldest one still running
(`pg_snapshot_xmin`): everything below that horizon has committed or aborted for good.
The price is lag while a long transaction is open, which the statement and
idle-in-transaction timeouts bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import asyncpg

from evora.storage.statements import load

READ_OUTBOX, BACKLOG, OLDEST_DUE, PRUNED = load(
    "outbox", "read_outbox", "backlog", "oldest_due", "pruned"
)


@dataclass(frozen=True, order=True)
class OutboxCursor:
    """Position after the last event consumed; (0, 0) is the beginning."""

    xid: int = 0
    seq: int = 0


class OutboxEvent(NamedTuple):
    """One event as the read models see it: built straight from the row's tuple (the
    projector turns every event of the outbox into one, so it must cost next to nothing)."""

    xid: int
    seq: int
    job_id: str
    queue: str
    type: str
    event: str
    from_state: str | None
    to_state: str
    worker_id: str | None
    at: datetime
    # the job's run_at and started_at after the change
    run_at: datetime | None
    started_at: datetime | None
    # the event data's error (None: the event reports none) and reason
    error: Any
    reason: str | None

    @property
    def cursor(self) -> OutboxCursor:
        return OutboxCursor(self.xid, self.seq)


async def read_events(
    conn: asyncpg.Connection | asyncpg.Pool, after: OutboxCursor, limit: int = 1000
) -> list[OutboxEvent]:
    """The next committed events after `after`, oldest transaction first. An empty list
    means the reader is caught up with everything that can no longer change."""
    rows = await conn.fetch(READ_OUTBOX, str(after.xid), after.seq, limit)
    make = OutboxEvent._make
    return [make(row) for row in rows]


@dataclass(frozen=True)
class Backlog:
    events: int
    oldest: datetime | None


async def backlog(
    conn: asyncpg.Connection | asyncpg.Pool, after: OutboxCursor, cap: int = 100_000
) -> Backlog:
    row = await conn.fetchrow(BACKLOG, str(after.xid), after.seq, cap)
    assert row is not None
    return Backlog(int(row["events"]), row["oldest"])


async def pruned_counts(
    conn: asyncpg.Connection | asyncpg.Pool, queues: list[str]
) -> dict[str, dict[str, int]]:
    """queue -> state -> jobs pruned so far, for `queues`."""
    counts: dict[str, dict[str, int]] = {}
    for row in await conn.fetch(PRUNED, queues):
        counts.setdefault(row["queue"], {})[row["state"]] = int(row["pruned"])
    return counts


async def oldest_due(
    conn: asyncpg.Connection | asyncpg.Pool, queues: list[str]
) -> dict[str, datetime | None]:
    rows = await conn.fetch(OLDEST_DUE, queues)
    return {row["queue"]: row["oldest"] for row in rows}
