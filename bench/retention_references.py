"""What retention's removal of finished jobs costs PostgreSQL, with the rows other tables keep
for a job (callbacks, dependency edges, trace contexts, spawned children) removed by the
statement trigger `jobs_references_removed` (migration 0061) or, as before it, by four foreign
keys' ON DELETE CASCADE, which ran a query of each of those tables for every deleted job.

    python -m bench.retention_references [--jobs 20000] [--rounds 3] [--references-every 0]

Each round, for each variant in turn, in a database of its own on one durable PostgreSQL:
`--jobs` jobs submitted, claimed and completed through the JobStore, every
`--references-every`-th of them (0: none) given one row in each of the four tables, a
CHECKPOINT, then `evora.prune_finished()` in batches of 1,000 (the sweeper's call) until
nothing is left. Prints the backend's CPU (from /proc: resolution 10 ms, so 0.5 us a job at
20,000 jobs), the wall time and the WAL per pruned job. The `cascade` variant is today's
schema with the trigger dropped and the four foreign keys put back.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import asyncpg

from bench import procstats
from evora.embedded import LocalPostgres
from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import Completion, JobStore
from evora.storage.migrate import apply_migrations

CASCADE = """
DROP TRIGGER jobs_references_removed ON evora.jobs;
ALTER TABLE evora.callbacks ADD CONSTRAINT callbacks_job_id_fkey
    FOREIGN KEY (job_id) REFERENCES evora.jobs (id) ON DELETE CASCADE;
ALTER TABLE evora.job_dependencies ADD CONSTRAINT job_dependencies_job_id_fkey
    FOREIGN KEY (job_id) REFERENCES evora.jobs (id) ON DELETE CASCADE;
ALTER TABLE evora.job_traces ADD CONSTRAINT job_traces_job_id_fkey
    FOREIGN KEY (job_id) REFERENCES evora.jobs (id) ON DELETE CASCADE;
ALTER TABLE evora.spawned_children ADD CONSTRAINT spawned_children_parent_fkey
    FOREIGN KEY (parent) REFERENCES evora.jobs (id) ON DELETE CASCADE;
"""
# One row in each table for each of $1, as their writers leave them.
REFERENCES = """
WITH ids AS (SELECT unnest($1::uuid[]) AS j),
callbacks AS (
    INSERT INTO evora.callbacks (id, secret_hash, job_id, attempt, on_timeout, created_at,
                                 timeout_at, outcome, settled_at)
    SELECT gen_random_uuid(), sha256(uuid_send(j)), j, 1, 'fail', evora.clock_now(),
           evora.clock_now(), 'resolved', evora.clock_now() FROM ids),
edges AS (INSERT INTO evora.job_dependencies (job_id, depends_on)
          SELECT j, gen_random_uuid() FROM ids),
traces AS (INSERT INTO evora.job_traces (job_id, traceparent)
           SELECT j, '00-' || md5(j::text) || '-0000000000000001-01' FROM ids)
INSERT INTO evora.spawned_children (parent, child) SELECT j, gen_random_uuid() FROM ids
"""
LEFT = """
SELECT (SELECT count(*) FROM evora.callbacks) + (SELECT count(*) FROM evora.job_dependencies)
     + (SELECT count(*) FROM evora.job_traces) + (SELECT count(*) FROM evora.spawned_children)
"""
VARIANTS = ("trigger", "cascade")


async def _finished_jobs(dsn: str, jobs: int, every: int) -> None:
    pool = await create_pool(dsn, min_size=1, max_size=2)
    try:
        store = JobStore(pool)
        for first in range(0, jobs, 1000):
            count = min(1000, jobs - first)
            await store.submit_batch([JobSubmission(queue="q", type="t") for _ in range(count)])
        while claimed := await store.claim(worker_id="w", queues=["q"], max_jobs=100):
            await store.complete_many([Completion(j["id"], j["lease_token"]) for j in claimed])
            if every:
                await pool.execute(REFERENCES, [j["id"] for j in claimed[::every]])
    finally:
        await pool.close()


async def _round(pg: LocalPostgres, name: str, variant: str, args: argparse.Namespace) -> str:
    admin = await asyncpg.connect(pg.dsn())
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = pg.dsn(name)
    await apply_migrations(dsn)
    if variant == "cascade":
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(CASCADE)
        finally:
            await conn.close()
    await _finished_jobs(dsn, args.jobs, args.references_every)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CHECKPOINT")
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        lsn = await conn.fetchval("SELECT pg_current_wal_insert_lsn()")
        cpu, wall, pruned = procstats.cpu_seconds(pid), time.perf_counter(), 0
        while n := await conn.fetchval("SELECT evora.prune_finished(0, 1000, 'COMPLETED')"):
            pruned += n
        wall = time.perf_counter() - wall
        cpu_after = procstats.cpu_seconds(pid)
        wal = await conn.fetchval("SELECT pg_current_wal_insert_lsn() - $1::pg_lsn", lsn)
        left = await conn.fetchval(LEFT)
    finally:
        await conn.close()
    assert cpu is not None and cpu_after is not None
    return (
        f"{variant:<8} pruned {pruned:>7}: backend CPU {1e6 * (cpu_after - cpu) / pruned:6.2f}"
        f" us/job, wall {1e6 * wall / pruned:6.2f} us/job, WAL {int(wal) / pruned:5.0f} B/job,"
        f" rows of other tables left {left}"
    )


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="evora-retention-references-") as tmp:
        pg = LocalPostgres(Path(tmp) / "data")
        pg.start()
        try:
            for r in range(args.rounds):
                for variant in VARIANTS:
                    print(await _round(pg, f"{variant}_{r}", variant, args), flush=True)
        finally:
            pg.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--references-every", type=int, default=0, help="every Nth job gets referencing rows"
    )
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
