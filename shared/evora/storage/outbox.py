"""Gap-free reading of the `job_events` outbox (rule 5 of docs/architecture.md), for the
projector: each batch summed up in SQL, so that what crosses to the projector grows with the
queues and workers a batch touches, not with its events.

Sequence numbers are taken at insert but become visible at commit, so `seq > last` can skip
an event whose transaction commits after a later one. The outbox is read PgQ's way instead,
in spans between two snapshots: a span holds the events of the transactions visible in its
target snapshot and not in the previous one (`Span`), read in (xid, seq) order, in several
batches if it is big. A transaction still open at the target is in neither, and lands in
the span after it commits: a long transaction anywhere in the cluster delays only its own
events, never the others' (docs/architecture.md, "the outbox").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import asyncpg

from evora.storage.statements import load

READ_BATCH, TARGET_TAKEN, BACKLOG, OLDEST_DUE, PRUNED, IN_RECOVERY = load(
    "outbox", "read_batch", "target_taken", "backlog", "oldest_due", "pruned", "in_recovery"
)
# read_batch with its last column, the history, NULL: for a server that refuses to tell it
# (HISTORY_REFUSALS). The functions it is read with are left out of the statement, not
# skipped inside it: PostgreSQL checks the privilege to call a function, and looks it up,
# before it runs anything.
READ_BATCH_BLIND = READ_BATCH[: READ_BATCH.rindex("(pg_control_system())")] + "NULL AS history"

# What reading the history fails with on a server that will not tell it for as long as it
# runs as it does: the role may not call a function it is read with (a hardening policy's
# REVOKE EXECUTE ... FROM PUBLIC), the function does not exist, or the build does not
# support it (Aurora: "currently not supported", feature_not_supported; on its writer
# "wal_level must be set to 'logical'", object_not_in_prerequisite_state). The last is also
# what a server in recovery answers ("recovery is in progress"): `in_recovery` tells them
# apart.
HISTORY_REFUSALS: tuple[type[asyncpg.PostgresError], ...] = (
    asyncpg.InsufficientPrivilegeError,
    asyncpg.UndefinedFunctionError,
    asyncpg.FeatureNotSupportedError,
    asyncpg.ObjectNotInPrerequisiteStateError,
)


# A snapshot in which no transaction is visible: the start of the outbox.
NOTHING_VISIBLE = "1:1:"


@dataclass(frozen=True, order=True)
class OutboxCursor:
    """Position after the last event consumed: the span's number, then (xid, seq) within it
    (the order events are read in); (0, 0, 0) is the beginning."""

    span: int = 0
    xid: int = 0
    seq: int = 0


@dataclass(frozen=True)
class Span:
    """The events of transactions visible in `target` and not in `prev` (pg_snapshot text).
    A target of None is not fixed yet: the next read takes the current snapshot."""

    prev: str = NOTHING_VISIBLE
    target: str | None = None

    def unseen_from(self, after: OutboxCursor) -> tuple[list[str], tuple[int, int]]:
        """What of `prev` the read's index scans start from: its running transactions, and
        the (xid, seq) after which everything past its xmax is scanned, not before `after`."""
        _, xmax, running = self.prev.split(":")
        start = (after.xid, after.seq) if after.xid >= int(xmax) else (int(xmax), -1)
        return [xid for xid in running.split(",") if xid], start


class EventGroup(NamedTuple):
    """Events of one batch alike in everything the read models count."""

    queue: str
    worker_id: str | None
    event: str
    from_state: str | None
    to_state: str
    bucket: int  # time bucket since the epoch, of the `bucket_seconds` given
    lease_expiry: bool  # a dead-lettering because the lease ran out
    for_queue: bool  # past the queue document's cursor: counts for it
    for_worker: bool  # has a worker, past the worker document's cursor: counts for it
    events: int
    wait_ms_sum: float  # due to claimed, of its claims
    wait_n: int
    run_ms_sum: float  # claimed to completed, of its completions
    run_n: int
    first: int  # position in the batch of its first event, from 1
    last: int  # and of its last
    max_seq: int
    last_cursor: OutboxCursor
    last_at: datetime
    first_at: datetime


class FailureEvent(NamedTuple):
    """An event that reports an error."""

    cursor: OutboxCursor
    job_id: str
    queue: str
    type: str
    at: datetime
    error: dict[str, Any]


@dataclass(frozen=True)
class Batch:
    groups: list[EventGroup]
    # queue -> (wait samples, run samples), ms, in event order; only events counting for it
    samples: dict[str, tuple[list[float], list[float]]]
    # worker -> (jobs started running under it and running at the batch's end, in the
    # order they last started; jobs running under it at the start, no longer at the end)
    runs: dict[str, tuple[list[str], list[str]]]
    failures: list[FailureEvent]
    target: str  # the span's target snapshot
    # the PostgreSQL history it was read on (HistoryChanged); None: read without it
    history: str | None

    @property
    def events(self) -> int:
        return max(g.last for g in self.groups)  # positions count every event from 1

    @property
    def upto(self) -> OutboxCursor:
        """The batch's last event."""
        return self._last.last_cursor

    @property
    def at(self) -> datetime:
        """When the batch's last event happened."""
        return self._last.last_at

    @property
    def max_seq(self) -> int:
        return max(g.max_seq for g in self.groups)

    @property
    def _last(self) -> EventGroup:
        return max(self.groups, key=lambda g: g.last)


class HistoryChanged(Exception):
    """The outbox is read on another history of PostgreSQL than the one a span's snapshots
    were taken on: another cluster (a restore elsewhere), or a new timeline (a promoted
    standby, a point-in-time recovery). A history is the cluster's system identifier and its
    timeline, "<system identifier>/<timeline as in WAL file names>".

    A snapshot's xids mean something only on the history it was taken on. A standby promoted
    without the old primary's last commits (asynchronous replication) hands their xids out
    again: a new transaction's events then sit below a stored target's xmax and outside its
    running list, never read by its span nor any later one, while the lost transactions'
    events stay counted. Nothing read on the new history can tell which xids those were."""

    def __init__(self, stored: str, found: str) -> None:
        super().__init__(f"the span's snapshots were taken on {stored}, PostgreSQL is now {found}")
        self.stored = stored
        self.found = found


async def read_batch(
    conn: asyncpg.Connection | asyncpg.Pool,
    span: Span,
    after: OutboxCursor,
    limit: int,
    *,
    bucket_seconds: int,
    upto: OutboxCursor | None = None,
    past: dict[str, dict[str, OutboxCursor]] | None = None,
    history: str | None = None,
    read_history: bool = True,
) -> Batch | None:
    """The next events of `span` after `after` (at most `limit`; with `upto`, exactly those
    up to it), summed up in PostgreSQL; their cursors are in span number `after.span`.
    `past` names the queues and workers whose documents already hold events past `after`
    ({"queues" or "workers": {key: cursor}}): events up to that cursor do not count for them.
    `history`: the one `span`'s snapshots were taken on (None: not known, a span from the
    start of the outbox or from before histories were kept); read on another, HistoryChanged
    is raised, nothing new or not. `read_history` False reads the batch without the history
    (READ_BATCH_BLIND: a server that refuses it), compared with nothing and returned as None.
    None means the span holds nothing more (a span without a target: nothing new)."""
    bounds = {
        kind: {key: [cursor.xid, cursor.seq] for key, cursor in cursors.items()}
        for kind, cursors in (past or {}).items()
    }
    running, (start_xid, start_seq) = span.unseen_from(after)
    row = await conn.fetchrow(
        READ_BATCH if read_history else READ_BATCH_BLIND,
        str(after.xid),
        after.seq,
        limit,
        None if upto is None else str(upto.xid),
        None if upto is None else upto.seq,
        bounds,
        bucket_seconds,
        span.target,
        running,
        str(start_xid),
        start_seq,
    )
    assert row is not None
    if read_history and history is not None and row["history"] != history:
        raise HistoryChanged(history, row["history"])
    if row["groups"] is None:
        return None
    if span.target is None:
        # A new target, which the caller stores outside PostgreSQL: first put on disk every
        # commit it counts finished (sql/outbox.sql, target_taken).
        await conn.execute(TARGET_TAKEN, row["target"])
    return Batch(
        groups=[_group(g, after.span) for g in row["groups"]],
        samples={q: (w, r) for q, (w, r) in (row["samples"] or {}).items()},
        runs={w: (started, stopped) for w, (started, stopped) in (row["runs"] or {}).items()},
        failures=[_failure(f, after.span) for f in row["failures"] or ()],
        target=row["target"],
        history=row["history"],
    )


def _group(g: list[Any], span: int) -> EventGroup:
    # the counted fields in the statement's order, then the last event and the first's time
    xid, seq, last_at, first_at = g[-4:]
    return EventGroup._make(
        [
            *g[:-4],
            OutboxCursor(span, xid, seq),
            datetime.fromisoformat(last_at),
            datetime.fromisoformat(first_at),
        ]
    )


def _failure(f: list[Any], span: int) -> FailureEvent:
    xid, seq, job_id, queue, job_type, at, error = f
    return FailureEvent(
        OutboxCursor(span, xid, seq), job_id, queue, job_type, datetime.fromisoformat(at), error
    )


async def in_recovery(conn: asyncpg.Connection) -> bool:
    """Whether the server `conn` is on is a standby (or recovering): its refusal to tell its
    history is then no reason to read the outbox without it (sql/outbox.sql, in_recovery)."""
    return bool(await conn.fetchval(IN_RECOVERY))


@dataclass(frozen=True)
class Backlog:
    events: int
    oldest: datetime | None


async def backlog(
    conn: asyncpg.Connection | asyncpg.Pool, span: Span, after: OutboxCursor, cap: int = 100_000
) -> Backlog:
    """Committed events not consumed by a checkpoint at `after` in `span`."""
    row = await conn.fetchrow(BACKLOG, span.prev, span.target, str(after.xid), after.seq, cap)
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
