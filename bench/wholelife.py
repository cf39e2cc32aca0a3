"""`python -m bench compare --whole-life`: what a system's finished jobs still cost PostgreSQL
after the drain, measured the way the drain is (WAL bytes, PostgreSQL CPU from /proc, wall
time), each deferred part on its own.

graphile-worker and pgqueuer delete a job as it completes, inside the drain; Evora leaves it
in `jobs` and its events in `job_events` for the sweeper (retention, the incremental audit)
and autovacuum to deal with later. Without these parts the drain's per-job bill compares a
system that pays as it goes with one that pays later.

How each part is run (after the latency run, every process of the system stopped, so
nothing else works meanwhile):

- a CHECKPOINT first, outside the measurement, for a part that comes long after the drain
  (`Part.later`: retention, a day later): the first change to each page then writes a
  full-page image again, as it would with the day's checkpoints between; the others (the
  audit, autovacuum, pgqueuer's log aggregation) come within a minute or so, usually before
  the next checkpoint, and run without one;
- `vacuum`: `VACUUM (ANALYZE false)` of every table of the system's schemas, what autovacuum
  does later (dead rows of the updates and deletes; the visibility map of inserted rows);
- Evora only (`EvoraSystem.deferred_parts`): the sweeper's audit over the run's events, its
  retention of the finished jobs, the drop of the events' partitions (the rows' and their
  twins of the batches, migration 0064), and a second vacuum after the retention's deletes.

Autovacuum is turned off for the system's tables (`autovacuum_enabled = false`) from before
the enqueue, so none of that work falls into a measured phase or between two of them unseen;
how many autovacuum and autoanalyze runs happened anyway is recorded (`autovacuum_runs`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass

import asyncpg

from evora.http.metrics import ServiceMetrics
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.retention import PRUNABLE_STATES, RetentionStore
from evora_services.sweeper.metrics import SweeperMetrics
from evora_services.sweeper.sweeper import Retention, Sweeper, Tuning

# How far the retention pass runs the database's clock ahead: past the end of the day's
# job_events partition (partitions are a day wide by default), wherever in the day the run is.
CLOCK_AHEAD = "1 day"
# How long after its session ended a backend is surely gone (exited and reaped).
REAPED_S = 0.5
# What a part did (rows removed, events read, tables vacuumed ...), for the report.
Counts = dict[str, int]


@dataclass(frozen=True)
class Part:
    name: str
    run: Callable[[], Awaitable[Counts]]
    # True for work that comes long after the drain (retention, a day later): a CHECKPOINT
    # first, as checkpoints fall between, so its first change to each page writes a full-page
    # image again. Autovacuum, the audit and pgqueuer's log aggregation come within a minute
    # or so, usually before the next checkpoint (checkpoint_timeout is 5 minutes).
    later: bool = False


_TABLES = """
SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = ANY($1::text[]) AND c.relkind = 'r'
ORDER BY 1
"""

_OTHERS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
"""

_STATS = """
SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0)::int8 AS runs,
       coalesce(sum(n_dead_tup), 0)::int8 AS dead
FROM pg_stat_user_tables WHERE schemaname = ANY($1::text[])
"""


async def tables(conn: asyncpg.Connection, schemas: Sequence[str]) -> list[str]:
    """The (qualified, quoted) plain tables of `schemas`: partitions, not their parents."""
    return [row[0] for row in await conn.fetch(_TABLES, list(schemas))]


async def autovacuum_off(conn: asyncpg.Connection, schemas: Sequence[str]) -> None:
    for table in await tables(conn, schemas):
        await conn.execute(
            f"ALTER TABLE {table} SET (autovacuum_enabled = false,"
            " toast.autovacuum_enabled = false)"
        )


async def wait_alone(conn: asyncpg.Connection, timeout_s: float = 30.0) -> None:
    """Waits until no other session is connected to the database, and a little longer: a
    backend that exits while the cluster's CPU is read (the postmaster's count of reaped
    children first, then the live ones) would be counted in neither, or its whole life in a
    part."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not await conn.fetchval(_OTHERS):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(REAPED_S)


async def flush_stats(conn: asyncpg.Connection) -> None:
    """Has the session's counts of rows changed (what `n_dead_tup` is made of) reported now,
    not within the next seconds as a busy session's are: the next part reads them."""
    if conn.get_server_version().major >= 15:  # pg_stat_force_next_flush() is new in 15
        await conn.execute("SELECT pg_stat_force_next_flush()")


async def autovacuum_runs(conn: asyncpg.Connection, schemas: Sequence[str]) -> int:
    runs: int = (await conn.fetchrow(_STATS, list(schemas)))["runs"]
    return runs


def vacuum(conn: asyncpg.Connection, schemas: Sequence[str], name: str = "vacuum") -> Part:
    """VACUUM of every table of `schemas`, as autovacuum would do it once due; counts the
    dead rows the statistics showed before it."""

    async def run() -> Counts:
        found = await tables(conn, schemas)
        dead: int = (await conn.fetchrow(_STATS, list(schemas)))["dead"]
        await conn.execute(f"VACUUM (ANALYZE false) {', '.join(found)}")
        return {"tables": len(found), "dead_tuples_before": dead}

    return Part(name, run)


async def evora_parts(
    conn: asyncpg.Connection, dsn: str, stack: AsyncExitStack, schemas: Sequence[str]
) -> list[Part]:
    """Evora's deferred work, done by a `Sweeper` as the sweeper service does it (its
    `audit_due` and `prune_due`, default tuning), with every retention window 0 (the
    settings' floor is 60 s, so the windows are given to the `Retention` directly) and the
    database's clock run a day ahead for the retention pass: the day's `job_events` partition
    then lies past its end, as it does once the day is over. Its connections are opened here,
    before anything is measured."""
    windows = Retention(jobs=dict.fromkeys(PRUNABLE_STATES, 0.0), idempotency_keys=0.0, events=0.0)
    now = await _pool(dsn, stack)
    metrics = ServiceMetrics("sweeper")
    sweeper = Sweeper(
        JobStore(now), RetentionStore(now), SweeperMetrics(metrics), windows, Tuning()
    )
    database = await conn.fetchval("SELECT current_database()")
    await conn.execute(f"ALTER DATABASE \"{database}\" SET evora.clock_offset = '{CLOCK_AHEAD}'")
    try:
        ahead = await _pool(dsn, stack)
    finally:
        await conn.execute(f'ALTER DATABASE "{database}" RESET evora.clock_offset')
    pruner = Sweeper(
        JobStore(ahead),
        RetentionStore(ahead),
        SweeperMetrics(ServiceMetrics("sweeper")),
        windows,
        Tuning(),
    )

    async def audit() -> Counts:
        passes = 1
        # A backlog: pass after pass, as the sweeper reads one (without its Tuning.min_wait
        # of 0.05 s between passes, which is no work).
        while await sweeper.audit_due():
            passes += 1
        events = metrics.registry.get_sample_value("evora_audit_events_total") or 0
        return {"passes": passes, "events": int(events)}

    async def retention() -> Counts:
        removed = dict(await pruner.prune_due())
        async with ahead.acquire() as session:
            await flush_stats(session)
        return removed

    return [
        Part("audit", audit),
        vacuum(conn, schemas, "vacuum after the drain"),
        Part("retention", retention, later=True),
        vacuum(conn, schemas, "vacuum after retention"),
    ]


async def _pool(dsn: str, stack: AsyncExitStack) -> asyncpg.Pool:
    pool = await create_pool(dsn, application_name="evora-bench-sweeper", min_size=1, max_size=1)
    stack.push_async_callback(pool.close)
    return pool
