"""Gap-free reading of the `job_events` outbox (rule 5 of docs/architecture.md), for the
projector: each batch summed up in SQL, so that what crosses to the projector grows with the
queues and workers a batch touches, not with its events.

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

READ_BATCH, BACKLOG, OLDEST_DUE, PRUNED = load(
    "outbox", "read_batch", "backlog", "oldest_due", "pruned"
)


@dataclass(frozen=True, order=True)
class OutboxCursor:
    """Position after the last event consumed; (0, 0) is the beginning."""

    xid: int = 0
    seq: int = 0


@dataclass(frozen=True, slots=True)
class QueueChange:
    """What one batch did to one queue, summed up by PostgreSQL."""

    queue: str
    cursor: OutboxCursor  # its last event in the batch
    at: datetime  # when that event happened
    moved: dict[str, int]  # state -> jobs in it now minus before
    totals: dict[str, int]  # event name -> events
    # minute since the epoch -> {event name: events, "wait_ms_sum", "wait_n", "run_ms_sum",
    # "run_n": the latency samples that fell in it}
    minutes: dict[int, dict[str, float]]
    completed: dict[int, int]  # completion bucket since the epoch -> completions
    waits: list[float]  # due to claimed, ms, oldest first
    runs: list[float]  # claimed to completed, ms, oldest first


@dataclass(frozen=True, slots=True)
class WorkerChange:
    """What one batch did to one worker: the jobs are those whose running under it changed
    across the batch (a job that started and stopped within it is in neither list)."""

    worker_id: str
    cursor: OutboxCursor
    first_at: datetime
    last_at: datetime
    counts: dict[str, int]  # claimed, completed, failed, released, lease_expired
    queues: list[str]  # in the order the batch first met them
    started: list[str]  # running under it after the batch, in the order they last started
    stopped: list[str]  # running under it before the batch, no longer after


class FailureEvent(NamedTuple):
    """An event that reports an error."""

    xid: int
    seq: int
    job_id: str
    queue: str
    type: str
    at: datetime
    error: dict[str, Any]


@dataclass(frozen=True)
class Batch:
    upto: OutboxCursor  # the batch's last event
    at: datetime  # when that event happened
    events: int
    max_seq: int
    queues: list[QueueChange]
    workers: list[WorkerChange]
    failures: list[FailureEvent]


async def read_batch(
    conn: asyncpg.Connection | asyncpg.Pool,
    after: OutboxCursor,
    limit: int,
    *,
    minute_seconds: int,
    bucket_seconds: int,
    upto: OutboxCursor | None = None,
    applied: dict[str, dict[str, OutboxCursor]] | None = None,
) -> Batch | None:
    """The next committed events after `after` (at most `limit`; with `upto`, exactly those
    up to it), summed up per queue and worker. `applied` names the queues and workers whose
    documents already hold events past `after` ({"queues" or "workers": {key: cursor}}):
    only their events past that cursor count. None means the reader is caught up with
    everything that can no longer change."""
    bounds = {
        kind: {key: [cursor.xid, cursor.seq] for key, cursor in cursors.items()}
        for kind, cursors in (applied or {}).items()
    }
    row = await conn.fetchrow(
        READ_BATCH,
        str(after.xid),
        after.seq,
        limit,
        None if upto is None else str(upto.xid),
        None if upto is None else upto.seq,
        bounds,
        minute_seconds,
        bucket_seconds,
    )
    if row is None:
        return None
    return Batch(
        upto=OutboxCursor(row["xid"], row["seq"]),
        at=row["at"],
        events=int(row["events"]),
        max_seq=int(row["max_seq"]),
        queues=[_queue_change(q) for q in row["queues"]],
        workers=[_worker_change(w) for w in row["workers"]],
        failures=[_failure(f) for f in row["failures"]],
    )


def _queue_change(q: dict[str, Any]) -> QueueChange:
    return QueueChange(
        queue=q["queue"],
        cursor=OutboxCursor(q["xid"], q["seq"]),
        at=datetime.fromisoformat(q["at"]),
        moved=q["moved"],
        totals=q["totals"],
        minutes={int(minute): fields for minute, fields in q["minutes"].items()},
        completed={int(bucket): n for bucket, n in q["completed"].items()},
        waits=q["waits"],
        runs=q["runs"],
    )


def _worker_change(w: dict[str, Any]) -> WorkerChange:
    return WorkerChange(
        worker_id=w["worker_id"],
        cursor=OutboxCursor(w["xid"], w["seq"]),
        first_at=datetime.fromisoformat(w["first_at"]),
        last_at=datetime.fromisoformat(w["last_at"]),
        counts=w["counts"],
        queues=w["queues"],
        started=w["started"],
        stopped=w["stopped"],
    )


def _failure(f: list[Any]) -> FailureEvent:
    xid, seq, job_id, queue, job_type, at, error = f
    return FailureEvent(xid, seq, job_id, queue, job_type, datetime.fromisoformat(at), error)


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
