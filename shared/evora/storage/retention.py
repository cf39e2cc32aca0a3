"""What only the sweeper asks of PostgreSQL, apart from lease and TTL expiry (transitions,
run through `JobStore`): the next deadline to wake for, retention (pruning finished jobs and
old idempotency keys, making job_events' partitions ahead and dropping expired ones whole),
and the health figures the sweeper exports.
The statements, and why each is safe to run from several sweepers at once, are in
sql/retention.sql.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from evora.protocol.states import JobState
from evora.storage.audit import AuditReport, audit
from evora.storage.statements import load

log = logging.getLogger(__name__)

PRUNABLE_STATES = (JobState.COMPLETED, JobState.CANCELLED, JobState.DLQ)

# job_events' partitions (migration 0032): how wide each is, and how many are kept made ahead
# of the clock (EVORA_EVENT_PARTITION_SECONDS, EVORA_EVENT_PARTITIONS_AHEAD). The sweeper
# makes them every retention round, `evora migrate` too.
EVENT_PARTITION_SECONDS = 86_400
EVENT_PARTITIONS_AHEAD = 3
# How long a round of partition retention waits for a lock before it gives up until the next
# round: a DETACH waits for the readers of its partition, never blocks writers, but a DROP or
# an ATTACH queued behind a long reader must not stand in anyone's way for long.
PARTITION_LOCK_TIMEOUT_MS = 1_000
# What ends a round of partition retention until the next: a lock not had in time, or
# another round (a sweeper that lost its lock finishing beside the new leader) detaching or
# having dropped the same partition.
_ANOTHER_HAS_IT = (
    asyncpg.LockNotAvailableError,
    asyncpg.ObjectNotInPrerequisiteStateError,
    asyncpg.UndefinedTableError,
)

(
    SECONDS_UNTIL_DEADLINE,
    PRUNE_FINISHED,
    PRUNE_IDEMPOTENCY_KEYS,
    PRUNE_SUBMISSION_KEYS,
    PRUNE_FLOW_BUCKETS,
    MAKE_EVENT_PARTITIONS,
    EXPIRED_EVENT_PARTITIONS,
    RECORD_PROJECTOR_PROGRESS,
    PROJECTOR_PROGRESS_KEPT,
    OLDEST_WRITING_TRANSACTION_SECONDS,
    EVENT_PARTITIONS_AHEAD_SECONDS,
    JOBS_DEAD_TUPLES,
) = load(
    "retention",
    "seconds_until_deadline",
    "prune_finished",
    "prune_idempotency_keys",
    "prune_submission_keys",
    "prune_flow_buckets",
    "make_event_partitions",
    "expired_event_partitions",
    "record_projector_progress",
    "projector_progress_kept",
    "oldest_writing_transaction_seconds",
    "event_partitions_ahead",
    "jobs_dead_tuples",
)


# A rebuild's generation that has recorded no progress for this long is taken for abandoned:
# the active projector removes its row, which would otherwise hold event retention back for
# ever (a rebuild that died leaves it), and the rebuild, if it was only slow, stops at its next
# record (sql/retention.sql, record_projector_progress).
ABANDONED_REBUILD_SECONDS = 3600.0


async def record_projector_progress(
    conn: asyncpg.Connection | asyncpg.Pool, generation: int, consumed: str, active: bool
) -> bool:
    """`consumed`: the snapshot every span the generation consumed ended at. Whether the
    generation's row was there before (False the first time, and after it was removed as an
    abandoned rebuild's)."""
    kept: bool = await conn.fetchval(
        RECORD_PROJECTOR_PROGRESS, generation, consumed, active, ABANDONED_REBUILD_SECONDS
    )
    return kept


async def projector_progress_kept(conn: asyncpg.Connection | asyncpg.Pool, generation: int) -> bool:
    """Whether the generation's progress row is there."""
    kept: bool = await conn.fetchval(PROJECTOR_PROGRESS_KEPT, generation)
    return kept


@dataclass(frozen=True)
class DatabaseHealth:
    oldest_writing_transaction_seconds: float
    jobs_dead_tuples: int
    event_partitions_ahead_seconds: float


class RetentionStore:
    """The sweeper's own statements (besides `JobStore.expire_leases` / `expire_ttls`)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def seconds_until_deadline(self) -> float | None:
        """Seconds until the next lease, TTL, time limit or callback timeout runs out (<= 0:
        due now), None if none."""
        seconds: float | None = await self._pool.fetchval(SECONDS_UNTIL_DEADLINE)
        return seconds

    async def audit(
        self, *, since: timedelta | None, from_seq: int | None, max_events: int
    ) -> AuditReport:
        """The sweeper's incremental audit pass (evora.storage.audit, docs/audit.md)."""
        async with self._pool.acquire() as conn:
            return await audit(conn, since, from_seq=from_seq, max_events=max_events)

    async def prune_finished(self, state: JobState, older_than: float, limit: int) -> int:
        """Remove up to `limit` jobs in `state` that finished more than `older_than` seconds
        ago, counting them in job_prune_counts; returns how many were removed."""
        removed: int = await self._pool.fetchval(PRUNE_FINISHED, older_than, limit, state.value)
        return removed

    async def prune_idempotency_keys(self, older_than: float, limit: int) -> int:
        removed: int = await self._pool.fetchval(PRUNE_IDEMPOTENCY_KEYS, older_than, limit)
        return removed

    async def prune_submission_keys(self, limit: int) -> int:
        """Remove up to `limit` debounce and throttle keys that answer no later submission:
        a throttle key past its window, a debounce key whose job started or is gone."""
        removed: int = await self._pool.fetchval(PRUNE_SUBMISSION_KEYS, limit)
        return removed

    async def prune_flow_buckets(self, after: str, limit: int) -> tuple[int, str | None]:
        """Look at up to `limit` token buckets after the key `after` ('' from the start),
        removing those that carry nothing (a full bucket, or one no rate reads, not
        throttled); returns how many went and the key to go on after (None: the end)."""
        row = await self._pool.fetchrow(PRUNE_FLOW_BUCKETS, after, limit)
        assert row is not None
        return row["pruned"], row["last_key"]

    async def make_event_partitions(self, width: float, ahead: int) -> float:
        """Make job_events' partitions until `ahead` of `width` seconds lie beyond the
        clock; returns the seconds of partitions ahead."""
        async with self._pool.acquire() as conn:
            await conn.execute(f"SET lock_timeout = {PARTITION_LOCK_TIMEOUT_MS}")
            try:
                seconds: float = await conn.fetchval(MAKE_EVENT_PARTITIONS, width, ahead)
            finally:
                await conn.execute("RESET lock_timeout")
        return seconds

    async def drop_event_partitions(self, older_than: float, archived_only: bool) -> int:
        """Remove the partitions of job_events whose events are all older than `older_than`
        seconds, consumed by every projector generation and (`archived_only`) archived,
        oldest first, a range's two together (the rows' and the batches', migration 0064);
        returns how many ranges went. A lock not had within the lock timeout, or a
        partition another round is removing, ends the round (logged): what is left is
        retried next round, a detach left pending included."""
        dropped = 0
        async with self._pool.acquire() as conn:
            await conn.execute(f"SET lock_timeout = {PARTITION_LOCK_TIMEOUT_MS}")
            try:
                expired = await conn.fetch(EXPIRED_EVENT_PARTITIONS, older_than, archived_only)
                for partition in expired:
                    # Outside a transaction: DETACH ... CONCURRENTLY may run in none.
                    if partition["detach"] is not None:
                        await conn.execute(partition["detach"])
                    await conn.execute(partition["drop"])
                    if partition["range"]:
                        dropped += 1
            except _ANOTHER_HAS_IT as exc:
                log.warning("event partition retention stopped for this round: %s", exc)
            finally:
                await conn.execute("RESET lock_timeout")
        return dropped

    async def health(self) -> DatabaseHealth:
        async with self._pool.acquire() as conn:
            oldest: float = await conn.fetchval(OLDEST_WRITING_TRANSACTION_SECONDS)
            dead: int | None = await conn.fetchval(JOBS_DEAD_TUPLES)
            ahead: float | None = await conn.fetchval(EVENT_PARTITIONS_AHEAD_SECONDS)
        return DatabaseHealth(oldest, dead or 0, ahead if ahead is not None else 0.0)
