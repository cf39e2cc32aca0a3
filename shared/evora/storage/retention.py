"""What only the sweeper asks of PostgreSQL, apart from lease and TTL expiry. Those two are
transitions and live with the others in queries.py and `JobStore`. This module covers the
next deadline to wake for, retention (pruning finished jobs and old idempotency keys, and
dropping archived events), and the health figures the sweeper exports.

Every prune is ONE short statement that removes at most `limit` rows picked with
`FOR UPDATE SKIP LOCKED`, so it never holds a long transaction, never waits for a row
someone else is changing, and two sweepers running at once never remove the same row. A
job prune also adds what it removed to `job_prune_counts` in the same statement, so the
read models can still match the true per-state counts (see migration 0002).
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from evora.domain.states import JobState

PRUNABLE_STATES = (JobState.COMPLETED, JobState.CANCELLED, JobState.DLQ)

# Seconds until the earliest lease or TTL runs out, by the database's clock (a replica's own
# clock cannot skew it), negative if one is already due, NULL if none is pending. Each
# `min` is one probe of a partial index (jobs_running_lease, jobs_pending_ttl).
SECONDS_UNTIL_DEADLINE = """
SELECT extract(epoch FROM least(
    (SELECT min(lease_expires_at) FROM jobs WHERE state = 'RUNNING'),
    (SELECT min(expires_at) FROM jobs
     WHERE state = 'PENDING' AND expires_at IS NOT NULL AND started_at IS NULL)
) - now())::float8
"""


def _prune_finished(state: JobState) -> str:
    # The state is spelled out rather than a parameter: only a literal lets the planner prove
    # the `jobs_finished` partial index applies in a generic (prepared) plan too.
    # ORDER BY in the INSERT takes the counter rows' locks in one order, so two sweepers
    # pruning at once cannot deadlock on them.
    return f"""
WITH gone AS (
    DELETE FROM jobs
    WHERE id IN (
        SELECT id FROM jobs
        WHERE state = '{state.value}' AND finished_at < now() - make_interval(secs => $1)
        ORDER BY finished_at
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    RETURNING queue, state
),
counted AS (
    INSERT INTO job_prune_counts AS c (queue, state, pruned)
    SELECT queue, state, count(*) FROM gone GROUP BY queue, state ORDER BY queue, state
    ON CONFLICT (queue, state) DO UPDATE SET pruned = c.pruned + excluded.pruned
)
SELECT count(*) FROM gone
"""


# $1 age in seconds, $2 at most this many rows. Returns how many jobs were removed.
PRUNE_FINISHED = {state: _prune_finished(state) for state in PRUNABLE_STATES}

# $1 age in seconds, $2 at most this many rows. The window is for the key's age, but a key
# whose job still exists, in any state, is kept: replaying that submission must answer with
# that job (a DLQ job outlives the default key window), never create a second one. A key
# therefore lives for the window or as long as its job, whichever is longer.
PRUNE_IDEMPOTENCY_KEYS = """
WITH gone AS (
    DELETE FROM idempotency_keys
    WHERE (queue, key) IN (
        SELECT k.queue, k.key FROM idempotency_keys k
        WHERE k.created_at < now() - make_interval(secs => $1)
          AND NOT EXISTS (
              SELECT 1 FROM jobs j WHERE j.id = k.job_id)
        ORDER BY k.created_at
        LIMIT $2
        FOR UPDATE OF k SKIP LOCKED
    )
    RETURNING 1
)
SELECT count(*) FROM gone
"""

# -- events: the archive's retention path (migration 0004) -----------------------------------
#
# An event may leave job_events only when it is in the Parquet archive (inside the watermark
# `evora pipeline archive` records after verifying what it wrote), consumed by every
# projector generation, and older than the events window. The SQL function checks all three
# itself; the triggers on job_events let no other DELETE through.

# $1 older than (seconds), $2 at most this many rows. Returns how many events were removed.
DROP_ARCHIVED_EVENTS = """
SELECT evora_drop_archived_events(w.upto_seq, $1, $2) FROM event_archive_watermark w
"""

# $1 generation, $2 xid (text), $3 seq, $4 whether the generation is the active one. The
# projector's half: after each checkpoint it records how far it has consumed, so that
# retention (which has no MongoDB) knows. Once a generation is active the rows of older ones
# go: their read models are dropped and must not hold retention back for ever.
RECORD_PROJECTOR_PROGRESS = """
WITH recorded AS (
    INSERT INTO projector_progress (generation, xid, seq)
    VALUES ($1, $2::text::xid8, $3)
    ON CONFLICT (generation) DO UPDATE
        SET xid = excluded.xid, seq = excluded.seq, updated_at = now()
)
DELETE FROM projector_progress WHERE $4 AND generation < $1
"""


async def record_projector_progress(
    conn: asyncpg.Connection | asyncpg.Pool, generation: int, xid: int, seq: int, active: bool
) -> None:
    await conn.execute(RECORD_PROJECTOR_PROGRESS, generation, str(xid), seq, active)


# Age of the oldest transaction in the cluster that holds an xid (has written something).
# The outbox is read below `pg_snapshot_xmin`, so such a transaction holds back the
# projector (and vacuum) for as long as it stays open. Cluster-wide on purpose: xids are.
OLDEST_WRITING_TRANSACTION_SECONDS = """
SELECT coalesce(extract(epoch FROM clock_timestamp() - min(xact_start)), 0)::float8
FROM pg_stat_activity
WHERE backend_xid IS NOT NULL
"""

# Dead row versions in `jobs` as the statistics collector last saw them.
JOBS_DEAD_TUPLES = """
SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables WHERE relid = 'jobs'::regclass
"""


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

    async def prune_finished(self, state: JobState, older_than: float, limit: int) -> int:
        """Remove up to `limit` jobs in `state` that finished more than `older_than` seconds
        ago, counting them in job_prune_counts; returns how many were removed."""
        removed: int = await self._pool.fetchval(PRUNE_FINISHED[state], older_than, limit)
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
