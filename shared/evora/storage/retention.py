"""What only the sweeper asks of PostgreSQL, apart from lease and TTL expiry (transitions,
run through `JobStore`): the next deadline to wake for, retention (pruning finished jobs and
old idempotency keys, dropping archived events), and the health figures the sweeper exports.
The statements, and why each is safe to run from several sweepers at once, are in
sql/retention.sql.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from evora.protocol.states import JobState
from evora.storage.audit import AuditReport, audit
from evora.storage.statements import load

PRUNABLE_STATES = (JobState.COMPLETED, JobState.CANCELLED, JobState.DLQ)

(
    SECONDS_UNTIL_DEADLINE,
    PRUNE_FINISHED,
    PRUNE_IDEMPOTENCY_KEYS,
    DROP_ARCHIVED_EVENTS,
    RECORD_PROJECTOR_PROGRESS,
    OLDEST_WRITING_TRANSACTION_SECONDS,
    JOBS_DEAD_TUPLES,
) = load(
    "retention",
    "seconds_until_deadline",
    "prune_finished",
    "prune_idempotency_keys",
    "drop_archived_events",
    "record_projector_progress",
    "oldest_writing_transaction_seconds",
    "jobs_dead_tuples",
)


async def record_projector_progress(
    conn: asyncpg.Connection | asyncpg.Pool, generation: int, consumed: str, active: bool
) -> None:
    """`consumed`: the snapshot every span the generation consumed ended at."""
    await conn.execute(RECORD_PROJECTOR_PROGRESS, generation, consumed, active)


@dataclass(frozen=True)
class DatabaseHealth:
    oldest_writing_transaction_seconds: float
    jobs_dead_tuples: int


class RetentionStore:
    """The sweeper's own statements (besides `JobStore.expire_leases` / `expire_ttls`)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def seconds_until_deadline(self) -> float | None:
        """Seconds until the next lease or TTL expiry (<= 0: due now), None if none."""
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

    async def drop_archived_events(self, older_than: float, limit: int) -> int:
        """Remove up to `limit` archived, projected events older than `older_than` seconds
        (oldest first); returns how many were removed."""
        removed: int = await self._pool.fetchval(DROP_ARCHIVED_EVENTS, older_than, limit)
        return removed

    async def health(self) -> DatabaseHealth:
        async with self._pool.acquire() as conn:
            oldest: float = await conn.fetchval(OLDEST_WRITING_TRANSACTION_SECONDS)
            dead: int | None = await conn.fetchval(JOBS_DEAD_TUPLES)
        return DatabaseHealth(oldest, dead or 0)
