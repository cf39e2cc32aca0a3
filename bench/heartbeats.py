"""Whether heartbeats are HOT updates of `jobs`, and what one costs in WAL.

Not a test: it measures and prints. It starts its own PostgreSQL (default durability) in a
temporary directory, applies the migrations of the `evora` package on the path, runs
`--what-if` SQL if given (a fillfactor, another sweep index), submits and claims `--jobs`
jobs, CHECKPOINTs, and sends each job `--beats` heartbeats through the job store, as a
worker's do (with progress every other one). It prints the share of those updates that were
HOT (`pg_stat_user_tables.n_tup_hot_upd`: no index entry, the new version on the same page),
the WAL bytes and full-page images per heartbeat and the cluster's CPU per heartbeat (every
PostgreSQL process, from /proc). Then what one sweeper pass reads with that many jobs
RUNNING and none of them expired (`--lease` outlasts the run): its next deadline
(`seconds_until_deadline`) and its lease expiry (`expire_leases`), each `--repeat` times
under EXPLAIN ANALYZE (median time, buffers, the indexes the plan uses).

    python -m bench.heartbeats --jobs 2000 --beats 5
    python -m bench.heartbeats --what-if "ALTER TABLE evora.jobs SET (fillfactor = 80)"
    python -m bench.heartbeats --jobs 100000 --beats 1 --what-if "DROP INDEX
        evora.jobs_running_lease; CREATE INDEX ON evora.jobs (submit_seq) WHERE state = 'RUNNING'"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

import asyncpg

from bench import procstats
from evora.embedded import LocalPostgres
from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations
from evora.storage.retention import SECONDS_UNTIL_DEADLINE
from evora.storage.rows import JobDict

UPDATES = (
    "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'evora.jobs'::regclass"
)
WAL = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8, (SELECT wal_fpi FROM pg_stat_wal)"


async def _counters(conn: asyncpg.Connection) -> tuple[int, int, int, int]:
    await conn.execute("SELECT pg_stat_force_next_flush()")
    updates = await conn.fetchrow(UPDATES)
    wal = await conn.fetchrow(WAL)
    assert updates is not None and wal is not None
    return updates[0], updates[1], wal[0], wal[1]


def _indexes(plan: dict[str, object]) -> set[str]:
    found = {str(plan["Index Name"])} if "Index Name" in plan else set()
    for child in plan.get("Plans", []):  # type: ignore[attr-defined]
        found |= _indexes(child)
    return found


async def _sweep(conn: asyncpg.Connection, repeat: int) -> None:
    """What the sweeper's pass reads: its next deadline and its lease expiry."""
    for label, sql, params in (
        ("seconds_until_deadline", SECONDS_UNTIL_DEADLINE, []),
        ("expire_leases", queries.EXPIRE_LEASES, [100, []]),
    ):
        times, buffers, used = [], 0, set()
        for _ in range(repeat):
            [row] = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *params)
            # the pool's connections decode json themselves (storage/db.py)
            [result] = json.loads(row[0]) if isinstance(row[0], str) else row[0]
            times.append(result["Execution Time"])
            plan = result["Plan"]
            buffers = plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)
            used = _indexes(plan)
        print(
            f"  sweeper {label:<24} {statistics.median(times):9.3f} ms {buffers:7d} buffers"
            f"  {', '.join(sorted(used)) or '(no index)'}"
        )


async def run(args: argparse.Namespace, dsn: str, postmaster: int) -> None:
    await apply_migrations(dsn)
    if args.what_if:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(args.what_if)
        finally:
            await conn.close()
    pool = await create_pool(dsn, min_size=2, max_size=2)
    store = JobStore(pool)
    try:
        for start in range(0, args.jobs, 1000):
            size = min(1000, args.jobs - start)
            # leases that outlast the run: EXPLAIN ANALYZE of the sweeper's expiry runs it, and
            # nothing may expire (a pass with nothing due is the one measured)
            await store.submit_batch(
                [JobSubmission(queue="hb", type="t", lease_seconds=args.lease)] * size
            )
        claimed: list[JobDict] = []
        while len(claimed) < args.jobs:
            claimed += await store.claim(worker_id="w", queues=["hb"], max_jobs=100)
        async with pool.acquire() as conn:
            await conn.execute("CHECKPOINT")
            before = await _counters(conn)
        cpu0 = procstats.cluster_cpu_seconds(postmaster)
        for beat in range(args.beats):
            for job in claimed:
                await store.heartbeat(
                    job["id"], job["lease_token"], progress={"beat": beat} if beat % 2 else None
                )
        cpu = procstats.cluster_cpu_seconds(postmaster) - cpu0
        async with pool.acquire() as conn:
            after = await _counters(conn)
        beats = args.jobs * args.beats
        updates, hot = after[0] - before[0], after[1] - before[1]
        print(
            f"{beats} heartbeats: {updates} updates, {hot} HOT ({hot / max(updates, 1):.0%}); "
            f"WAL {(after[2] - before[2]) / beats:,.0f} B and "
            f"{(after[3] - before[3]) / beats:.3f} full-page images per heartbeat; "
            f"PG CPU {cpu / beats * 1e6:.1f} us per heartbeat"
        )
        async with pool.acquire() as conn:
            await conn.execute("VACUUM ANALYZE evora.jobs")
            await _sweep(conn, args.repeat)
    finally:
        await store.close()
        await pool.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--beats", type=int, default=5, help="heartbeats per job")
    parser.add_argument("--what-if", help="SQL run after the migrations")
    parser.add_argument("--repeat", type=int, default=5, help="EXPLAIN ANALYZE runs per pass")
    parser.add_argument("--lease", type=int, default=3600, help="the jobs' lease_seconds")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="evora-heartbeats-") as tmp,
        LocalPostgres(Path(tmp) / "data", durable=True, log_path=Path(tmp) / "pg.log") as pg,
    ):
        postmaster = procstats.postmaster_pid(Path(tmp) / "data")
        assert postmaster is not None
        asyncio.run(run(args, pg.dsn("postgres"), postmaster))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
