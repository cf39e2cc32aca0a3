"""What migration 0063 (one unique index of a FIFO group's RUNNING and SUSPENDED jobs) costs on a
large `jobs` table.

Not a test: it measures and prints. It starts its own PostgreSQL 18 (`LocalPostgres`,
durable), migrates a database to 0062, loads `--jobs` rows straight into `evora.jobs`
(triggers off): `--running` RUNNING and as many SUSPENDED jobs, each of a FIFO group of its own,
the rest COMPLETED; VACUUM ANALYZEs, then times, each alone first (rolled back), the
migration's check for groups holding two such jobs and its build of the new index, then
`evora migrate` to the newest version as shipped (0063 and the function files, in one
transaction: writes to `jobs` wait for all of it, reads from the old indexes' drop on).

    python -m bench.group_index_migration                # 1,000,000 jobs
    python -m bench.group_index_migration --jobs 100000
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import asyncpg

from evora.embedded import LocalPostgres
from evora.storage.migrate import apply_migrations

BEFORE = 62

# $1 jobs, $2 RUNNING (and as many SUSPENDED), each of a group of its own
LOAD = """
INSERT INTO evora.jobs (id, queue, type, payload, priority, state, attempt, max_attempts,
                        lease_seconds, backoff_initial, backoff_max, backoff_multiplier, run_at,
                        worker_id, started_at, finished_at, created_at, updated_at, group_key,
                        lease_token, lease_expires_at)
SELECT gen_random_uuid(), 'q' || (n % 10), 't', '{}', 0, s.state, 1, 3, 60, 1, 60, 2, now(),
       'w', now(), CASE WHEN s.state = 'COMPLETED' THEN now() END, now(), now(),
       CASE WHEN s.state <> 'COMPLETED' OR n % 2 = 0 THEN 'g' || n END,
       CASE WHEN s.state = 'RUNNING' THEN gen_random_uuid() END,
       CASE WHEN s.state = 'RUNNING' THEN now() + interval '1 hour' END
FROM generate_series(1, $1) AS n
CROSS JOIN LATERAL (SELECT CASE WHEN n <= $2 THEN 'RUNNING'
                                WHEN n <= 2 * $2 THEN 'SUSPENDED'
                                ELSE 'COMPLETED' END::evora.job_state AS state) AS s
"""

# the migration's check and build, as 0063 writes them
CHECK = """
SELECT count(*) FROM (SELECT 1 FROM evora.jobs
                      WHERE state IN ('RUNNING', 'SUSPENDED') AND group_key IS NOT NULL
                      GROUP BY queue, group_key HAVING count(*) > 1) AS held
"""
BUILD = """
CREATE UNIQUE INDEX jobs_group_held ON evora.jobs (queue, group_key)
    WHERE state IN ('RUNNING', 'SUSPENDED') AND group_key IS NOT NULL
"""


async def timed_alone(conn: asyncpg.Connection, sql: str) -> float:
    """Seconds `sql` takes in a transaction rolled back after it."""
    tx = conn.transaction()
    await tx.start()
    try:
        started = time.perf_counter()
        await conn.execute(sql)
        return time.perf_counter() - started
    finally:
        await tx.rollback()


async def run(args: argparse.Namespace, dsn: str) -> None:
    await apply_migrations(dsn, upto=BEFORE)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET session_replication_role = replica")  # no triggers: a bulk load
        started = time.perf_counter()
        await conn.execute(LOAD, args.jobs, args.running)
        print(f"loaded {args.jobs:,} jobs in {time.perf_counter() - started:.1f} s")
        await conn.execute("RESET session_replication_role")
        await conn.execute("VACUUM ANALYZE evora.jobs")
        size = await conn.fetchval("SELECT pg_size_pretty(pg_table_size('evora.jobs'))")
        print(f"jobs: {size}, {args.running:,} RUNNING and {args.running:,} SUSPENDED grouped")
        print(f"  check alone: {await timed_alone(conn, CHECK):.2f} s")
        print(f"  build alone: {await timed_alone(conn, BUILD):.2f} s")
    finally:
        await conn.close()
    started = time.perf_counter()
    applied = await apply_migrations(dsn)
    print(f"evora migrate {applied}: {time.perf_counter() - started:.2f} s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--running", type=int, default=10_000, help="and as many SUSPENDED")
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="evora-group-index-") as tmp,
        LocalPostgres(Path(tmp) / "data", log_path=Path(tmp) / "postgres.log") as pg,
    ):
        asyncio.run(run(args, pg.dsn("postgres")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
