"""The pipeline's small conversation with PostgreSQL, beside the bulk reads over JDBC: locks,
the archive watermark, the projector's consumed horizon, and the exact counts that an
archive run is verified against.

The pipeline is synchronous (Spark's driver API is), so this runs the project's asyncpg on
a private event loop. The connection has no statement timeout: it belongs to a batch job,
and planning over a large table may take longer than a service's 30 s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, Self, TypeVar

import asyncpg

from evora.storage import locks
from evora.storage.db import connect
from evora_services.pipeline.events import Rectangle, between

log = logging.getLogger(__name__)

T = TypeVar("T")


class ArchiveConflict(Exception):
    """The watermark moved while this archive run was working: another run committed."""


@dataclass(frozen=True)
class Watermark:
    rectangle: Rectangle
    archived: int  # events in the archive
    max_seq: int  # the largest seq in the archive, 0 if empty


@dataclass(frozen=True)
class Slice:
    """Exact figures of a set of events, from PostgreSQL."""

    events: int
    min_seq: int
    max_seq: int
    per_day: dict[date, int]


@dataclass(frozen=True)
class ArchivePlan:
    old: Rectangle
    new: Rectangle
    cutoff: datetime
    slice: Slice


_WATERMARK = """
SELECT w.upto_seq, w.below_xid::text::int8 AS below_xid, w.archived,
       coalesce((SELECT max(r.max_seq) FROM evora.event_archive_runs r), 0) AS max_seq
FROM evora.event_archive_watermark w
"""

_HORIZON = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8"

# The lowest position any projector generation has consumed to (ORDER BY: xid8 has no min()
# before PostgreSQL 16): the xmin of the snapshot its spans reached. Every event with a
# smaller xid is visible in that snapshot, so in that generation's read models; some above
# it may be too, which only makes the archive wait (its events are older than the window).
_CONSUMED = "SELECT xid::text::int8 FROM evora.projector_progress ORDER BY xid LIMIT 1"

# $1 old upto_seq, $2 old below_xid, $3 candidate below_xid, $4 cutoff: the smallest xid of
# a late transaction (one that took a seq below the old bound but was not yet archivable)
# whose events are still too young. The new rectangle must stop below it.
_YOUNG_LATE_XID = """
SELECT xid::text::int8 FROM evora.job_events
WHERE seq <= $1 AND xid >= $2::text::xid8 AND xid < $3::text::xid8 AND at >= $4
ORDER BY xid LIMIT 1
"""

# $1 old upto_seq, $2 new below_xid, $3 cutoff: the first seq past the old bound that is too
# young. Only the partitions past the cutoff are read (`at` is their key), and of them the
# events past the bound: seq has only a BRIN index (migration 0059), no order to walk.
_FIRST_YOUNG_SEQ = """
SELECT min(seq) FROM evora.job_events
WHERE seq > $1 AND xid < $2::text::xid8 AND at >= $3
"""

# The newest seq there is (evora.last_event_seq(): no max(seq) over the whole history).
_LAST_SEQ = "SELECT evora.last_event_seq()"

_COMMITTED_RUNS = "SELECT run_id FROM evora.event_archive_runs"

_ADVANCE = """
UPDATE evora.event_archive_watermark
SET upto_seq = $3, below_xid = $4::text::xid8, archived = archived + $5, updated_at = now()
WHERE upto_seq = $1 AND below_xid = $2::text::xid8
"""

_RECORD_RUN = """
INSERT INTO evora.event_archive_runs
    (run_id, from_seq, upto_seq, from_xid, below_xid, events, max_seq, partitions)
VALUES ($1, $2, $3, $4::text::xid8, $5::text::xid8, $6, $7, $8::jsonb)
"""


class ControlDB:
    def __init__(self, dsn: str) -> None:
        self._runner = asyncio.Runner()
        try:
            self._conn: asyncpg.Connection = self._run(
                connect(dsn, application_name="evora-pipeline", statement_timeout=None)
            )
        except BaseException:
            self._runner.close()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def close(self) -> None:
        try:
            self._run(self._conn.close())
        finally:
            self._runner.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- locking -----------------------------------------------------------------------

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the pipeline lock (archive runs and analytics runs one at a time). A killed
        run loses its connection and with it the lock."""
        if not self._run(
            self._conn.fetchval("SELECT pg_try_advisory_lock($1)", locks.PIPELINE_ARCHIVE)
        ):
            log.info("waiting for the pipeline lock: another archive or run is in progress")
            self._run(self._conn.execute("SELECT pg_advisory_lock($1)", locks.PIPELINE_ARCHIVE))
        try:
            yield
        finally:
            try:
                self._run(
                    self._conn.execute("SELECT pg_advisory_unlock($1)", locks.PIPELINE_ARCHIVE)
                )
            except Exception:  # a lost connection has released the lock already
                log.warning("could not release the pipeline lock", exc_info=True)

    # -- reading -----------------------------------------------------------------------

    def watermark(self) -> Watermark:
        row = self._run(self._conn.fetchrow(_WATERMARK))
        assert row is not None, "migration 0004 inserts the watermark row"
        return Watermark(
            Rectangle(int(row["upto_seq"]), int(row["below_xid"])),
            int(row["archived"]),
            int(row["max_seq"]),
        )

    def horizon(self) -> int:
        """The outbox horizon: every transaction with a smaller xid has ended for good."""
        return int(self._run(self._conn.fetchval(_HORIZON)))

    def consumed(self) -> int | None:
        """xid below which every projector generation has applied every event; None when
        no projector has recorded progress yet."""
        value = self._run(self._conn.fetchval(_CONSUMED))
        return None if value is None else int(value)

    def committed_runs(self) -> set[str]:
        return {row["run_id"] for row in self._run(self._conn.fetch(_COMMITTED_RUNS))}

    def measure(self, query: str) -> Slice:
        """Count, seq range and events per UTC day of `query`'s rows."""
        rows = self._run(
            self._conn.fetch(
                f"""SELECT (at AT TIME ZONE 'UTC')::date AS day, count(*) AS n,
                           min(seq) AS lo, max(seq) AS hi
                    FROM ({query}) AS e GROUP BY 1"""
            )
        )
        if not rows:
            return Slice(0, 0, 0, {})
        return Slice(
            events=sum(int(r["n"]) for r in rows),
            min_seq=min(int(r["lo"]) for r in rows),
            max_seq=max(int(r["hi"]) for r in rows),
            per_day={r["day"]: int(r["n"]) for r in rows},
        )

    # -- planning an archive run -------------------------------------------------------

    def plan_archive(self, older_than_seconds: float, max_events: int | None = None) -> ArchivePlan:
        """The largest rectangle whose every event is final, consumed by every projector
        generation and older than the window, and what it adds to the archive."""
        old = self.watermark().rectangle
        conn = self._conn
        cutoff: datetime = self._run(
            conn.fetchval("SELECT now() - make_interval(secs => $1)", float(older_than_seconds))
        )
        consumed = self.consumed()
        if consumed is None:
            log.warning("no projector has recorded its progress; nothing counts as consumed")
            return ArchivePlan(old, old, cutoff, Slice(0, 0, 0, {}))
        # consumed <= the horizon when it was read, and the horizon only grows; min() anyway,
        # so a hand-edited progress row cannot reach past running transactions.
        below_xid = max(old.below_xid, min(consumed, self.horizon()))
        young_late = self._run(
            conn.fetchval(_YOUNG_LATE_XID, old.upto_seq, str(old.below_xid), str(below_xid), cutoff)
        )
        if young_late is not None:
            below_xid = max(old.below_xid, int(young_late))
        first_young = self._run(
            conn.fetchval(_FIRST_YOUNG_SEQ, old.upto_seq, str(below_xid), cutoff)
        )
        if first_young is not None:
            upto_seq = int(first_young) - 1
        else:
            upto_seq = int(self._run(conn.fetchval(_LAST_SEQ)))
        if max_events is not None:
            # seqs are unique, so a range of max_events of them holds at most that many new
            # events: a cap read from no event at all (fewer per run where seqs were skipped)
            upto_seq = min(upto_seq, old.upto_seq + max_events)
        new = Rectangle(max(old.upto_seq, upto_seq), below_xid)
        measured = self.measure(between(old, new)) if new != old else Slice(0, 0, 0, {})
        return ArchivePlan(old, new, cutoff, measured)

    # -- committing --------------------------------------------------------------------

    def commit(self, run_id: str, plan: ArchivePlan) -> None:
        """Advance the watermark from the plan's old rectangle to its new one and record the
        run, in one transaction; ArchiveConflict if another run moved it first."""

        async def commit() -> None:
            async with self._conn.transaction():
                status = await self._conn.execute(
                    _ADVANCE,
                    plan.old.upto_seq,
                    str(plan.old.below_xid),
                    plan.new.upto_seq,
                    str(plan.new.below_xid),
                    plan.slice.events,
                )
                if status != "UPDATE 1":
                    raise ArchiveConflict("the archive watermark moved during this run")
                partitions = {day.isoformat(): n for day, n in sorted(plan.slice.per_day.items())}
                await self._conn.execute(
                    _RECORD_RUN,
                    run_id,
                    plan.old.upto_seq,
                    plan.new.upto_seq,
                    str(plan.old.below_xid),
                    str(plan.new.below_xid),
                    plan.slice.events,
                    plan.slice.max_seq,
                    partitions,
                )

        self._run(commit())
