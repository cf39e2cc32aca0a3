"""Gap-free reading of the `job_events` outbox (rule 5), for the projector and pipeline.

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
from typing import Any
from uuid import UUID

import asyncpg

from evora.domain.states import JobState
from evora.storage import queries


@dataclass(frozen=True, order=True)
class OutboxCursor:
    """Position after the last event consumed; (0, 0) is the beginning."""

    xid: int = 0
    seq: int = 0


@dataclass(frozen=True)
class OutboxEvent:
    xid: int
    seq: int
    job_id: UUID
    job_version: int
    queue: str
    type: str
    event: str
    from_state: JobState | None
    to_state: JobState
    attempt: int
    worker_id: str | None
    at: datetime
    data: dict[str, Any]
    job: dict[str, Any]

    @property
    def cursor(self) -> OutboxCursor:
        return OutboxCursor(self.xid, self.seq)


async def read_events(
    conn: asyncpg.Connection | asyncpg.Pool, after: OutboxCursor, limit: int = 1000
) -> list[OutboxEvent]:
    """The next committed events after `after`, oldest transaction first. An empty list
    means the reader is caught up with everything that can no longer change."""
    rows = await conn.fetch(queries.READ_OUTBOX, str(after.xid), after.seq, limit)
    return [
        OutboxEvent(
            xid=r["xid"],
            seq=r["seq"],
            job_id=r["job_id"],
            job_version=r["job_version"],
            queue=r["queue"],
            type=r["type"],
            event=r["event"],
            from_state=JobState(r["from_state"]) if r["from_state"] else None,
            to_state=JobState(r["to_state"]),
            attempt=r["attempt"],
            worker_id=r["worker_id"],
            at=r["at"],
            data=r["data"],
            job=r["job"],
        )
        for r in rows
    ]
