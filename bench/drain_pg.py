"""What PostgreSQL spends per drained job: CPU and WAL of the claim and completion path.

Not a test: it measures and prints. It starts its own PostgreSQL (`LocalPostgres`, default
durability) in a temporary directory, applies the migrations of the `evora` package on the
path (so `PYTHONPATH=<checkout>/shared` picks the code to measure), loads some
finished history (and with `--running`, jobs that other workers hold RUNNING in another
queue), and then, per round: submits `--jobs` jobs, CHECKPOINTs, and drains them
as one SDK worker does as deployed, one claim of `--batch` jobs at a time followed by one
`complete_many` of that batch. Per round it prints the cluster's CPU microseconds (every
PostgreSQL process, from /proc) and the WAL bytes per job of the submission (batches of
1,000, as the api stores them, after a CHECKPOINT) and of the drain, with the drain's
full-page images per job, and with `--waldump` the WAL of the last round's drain by record
type and by the relation each record is for (`pg_walinspect`). With `--widths`, what each
column of `jobs` takes in the drained rows (`pg_column_size`), the whole tuple's size, and how
many rows set each column: what a claim or a completion writes again, since either is a
non-HOT update whose WAL record carries the whole new row. `--payload-bytes N` pads each job's
payload by about N bytes (a payload stays in the row up to ~2 kB; a larger one is TOASTed and
the row carries a pointer to it).
`--perf DIR` records the last round's drain with `perf` (bench.pgperf: by process, by kind
of work, by function); `--statements` prints that drain's statements from
pg_stat_statements with `track = all` (the statements inside functions and triggers too,
so the nested ones count inside their callers' times as well) and the functions'
own times (`track_functions = all`).

    python -m bench.drain_pg --rounds 3 --jobs 10000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import asyncpg

from bench import pgperf, procstats
from evora.embedded import LocalPostgres
from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import Completion, JobStore
from evora.storage.migrate import apply_migrations

QUEUE = "drain"


async def submit(store: JobStore, jobs: int, payload_bytes: int = 0) -> None:
    for start in range(0, jobs, 1000):
        size = min(1000, jobs - start)
        items = [
            JobSubmission(queue=QUEUE, type="noop", payload={"n": i, **pad(payload_bytes)})
            for i in range(size)
        ]
        await store.submit_batch(items)


def pad(payload_bytes: int) -> dict[str, str]:
    """About `payload_bytes` of random hex: a payload PostgreSQL's compression cannot shrink
    much, the worst case for what the row carries (JSON documents compress better)."""
    return {"pad": os.urandom(payload_bytes // 2).hex()} if payload_bytes else {}


class Split:
    """PostgreSQL CPU seconds spent while claims, and while completions, were in flight."""

    def __init__(self, postmaster: int) -> None:
        self.postmaster = postmaster
        self.claim = 0.0
        self.complete = 0.0


async def drain(store: JobStore, batch: int, split: Split | None = None) -> int:
    drained = 0
    while True:
        c0 = procstats.cluster_cpu_seconds(split.postmaster) if split else 0.0
        jobs = await store.claim(worker_id="drain-worker", queues=[QUEUE], max_jobs=batch)
        c1 = procstats.cluster_cpu_seconds(split.postmaster) if split else 0.0
        if not jobs:
            return drained
        await store.complete_many(
            [Completion(j["id"], j["lease_token"]) for j in jobs], with_jobs=False
        )
        if split:
            split.claim += c1 - c0
            split.complete += procstats.cluster_cpu_seconds(split.postmaster) - c1
        drained += len(jobs)


async def wal(conn: asyncpg.Connection) -> tuple[str, int, int]:
    row = await conn.fetchrow(
        "SELECT pg_current_wal_lsn()::text AS lsn, "
        "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8 AS bytes, "
        "(SELECT wal_fpi FROM pg_stat_wal) AS fpi"
    )
    assert row is not None
    return row["lsn"], row["bytes"], row["fpi"]


async def wal_by_record(conn: asyncpg.Connection, start: str, end: str, jobs: int) -> str:
    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    rows = await conn.fetch(
        'SELECT "resource_manager/record_type" AS kind, count, record_size, fpi_size '
        "FROM pg_get_wal_stats($1::text::pg_lsn, $2::text::pg_lsn, true) WHERE count > 0 "
        "ORDER BY record_size + fpi_size DESC",
        start,
        end,
    )
    # a record's whole length counted once, for the relation of its first block (a heap
    # update with its indexes' records apart: each index insert is a record of its own)
    relations = await conn.fetch(
        "SELECT coalesce(c.relname, 'other') AS rel, b.resource_manager || '/' ||"
        "       split_part(b.record_type, ' ', 1) AS kind, count(*) AS count,"
        "       sum(b.record_length) AS bytes"
        " FROM (SELECT f.*, row_number() OVER (PARTITION BY f.start_lsn ORDER BY f.block_id)"
        "       FROM pg_get_wal_block_info($1::text::pg_lsn, $2::text::pg_lsn, true) f) b"
        " LEFT JOIN pg_class c ON c.relfilenode = b.relfilenode"
        " WHERE b.row_number = 1"
        " GROUP BY 1, 2 ORDER BY sum(b.record_length) DESC LIMIT 25",
        start,
        end,
    )
    return "\n".join(
        [
            *(
                f"  {r['kind']:<28} {r['count'] / jobs:6.2f}/job {r['record_size'] / jobs:7.0f}"
                f" B/job (+{r['fpi_size'] / jobs:.0f} FPI)"
                for r in rows
            ),
            "  by relation (records with blocks; length without full-page images):",
            *(
                f"  {r['rel']:<28} {r['kind']:<24} {r['count'] / jobs:6.2f}/job"
                f" {r['bytes'] / jobs:7.0f} B/job"
                for r in relations
            ),
        ]
    )


async def statements(conn: asyncpg.Connection, jobs: int) -> str:
    """pg_stat_statements since the reset (nested statements too), and the functions' own
    times, per drained job."""
    await asyncio.sleep(0.6)  # the functions' counts reach the view at the next stats flush
    rows = await conn.fetch(
        "SELECT calls, rows, total_exec_time, total_plan_time, plans, toplevel,"
        "       shared_blks_hit + shared_blks_read AS blocks, wal_records, wal_bytes,"
        "       left(regexp_replace(query, '\\s+', ' ', 'g'), 110) AS q"
        " FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat%'"
        " ORDER BY total_exec_time DESC LIMIT 25"
    )
    functions = await conn.fetch(
        "SELECT schemaname || '.' || funcname AS f, calls, total_time, self_time"
        " FROM pg_stat_user_functions ORDER BY self_time DESC LIMIT 15"
    )
    return "\n".join(
        [
            "  statements (us per drained job: execution, planning; calls, blocks, WAL"
            " records per job; * = top level):",
            *(
                f"  {r['total_exec_time'] * 1e3 / jobs:7.2f}"
                f" {r['total_plan_time'] * 1e3 / jobs:6.2f} us"
                f" {r['calls'] / jobs:6.3f} calls {r['blocks'] / jobs:6.1f} blk"
                f" {r['wal_records'] / jobs:5.2f} rec {'*' if r['toplevel'] else ' '} {r['q']}"
                for r in rows
            ),
            "  functions (us per drained job, total and self; calls per job):",
            *(
                f"  {r['total_time'] * 1e3 / jobs:7.2f} {r['self_time'] * 1e3 / jobs:7.2f} us"
                f" {r['calls'] / jobs:6.3f} calls  {r['f']}"
                for r in functions
            ),
        ]
    )


async def widths(conn: asyncpg.Connection) -> str:
    """Average bytes of each column of the drained jobs (NULL counts 0), and the share of rows
    that set it; the tuple as a whole (`pg_column_size` of the row: header and alignment
    included)."""
    columns = [
        r["attname"]
        for r in await conn.fetch(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'evora.jobs'::regclass"
            " AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
        )
    ]
    sizes = ", ".join(
        f'avg(coalesce(pg_column_size(j."{c}"), 0))::float8 AS "{c}",'
        f' avg((j."{c}" IS NOT NULL)::int)::float8 AS "{c}?"'
        for c in columns
    )
    row = await conn.fetchrow(
        f"SELECT avg(pg_column_size(j.*))::float8 AS tuple, {sizes}"
        f" FROM evora.jobs j WHERE j.queue = '{QUEUE}' AND j.state = 'COMPLETED'"
    )
    assert row is not None
    lines = [f"  whole row (pg_column_size of the tuple) {row['tuple']:7.1f} B"]
    lines += [
        f"  {c:<24} {row[c]:7.1f} B  set in {row[c + '?'] * 100:5.1f} % of rows"
        for c in sorted(columns, key=lambda c: -row[c])
    ]
    return "\n".join(lines)


async def run(args: argparse.Namespace, dsn: str, postmaster: int, data_dir: Path) -> None:
    await apply_migrations(dsn)
    if args.statements:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        finally:
            await conn.close()
    if args.what_if:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(args.what_if)
        finally:
            await conn.close()
    pool = await create_pool(dsn, min_size=2, max_size=2)
    store = JobStore(pool)
    try:
        await submit(store, args.history, args.payload_bytes)
        await drain(store, 1000)
        for start in range(0, args.running, 1000):
            # jobs other workers hold RUNNING in another queue while this one drains
            size = min(1000, args.running - start)
            await store.submit_batch([JobSubmission(queue="elsewhere", type="noop")] * size)
            await store.claim(worker_id="elsewhere", queues=["elsewhere"], max_jobs=size)
        await pool.execute("VACUUM ANALYZE evora.jobs")
        cpu: list[float] = []
        wal_per_job: list[float] = []
        submit_cpu: list[float] = []
        submit_wal: list[float] = []
        for round_ in range(1, args.rounds + 1):
            async with pool.acquire() as conn:
                await conn.execute("CHECKPOINT")
                _, swal0, _ = await wal(conn)
            s0 = procstats.cluster_cpu_seconds(postmaster)
            await submit(store, args.jobs, args.payload_bytes)
            submit_cpu.append((procstats.cluster_cpu_seconds(postmaster) - s0) / args.jobs * 1e6)
            async with pool.acquire() as conn:
                _, swal1, _ = await wal(conn)
            submit_wal.append((swal1 - swal0) / args.jobs)
            async with pool.acquire() as conn:
                await conn.execute("CHECKPOINT")
                lsn0, wal0, fpi0 = await wal(conn)
            last = round_ == args.rounds
            if last and args.statements:
                async with pool.acquire() as conn:
                    await conn.execute("SELECT pg_stat_statements_reset(), pg_stat_reset()")
            perf = pgperf.PgPerf(args.perf, postmaster) if last and args.perf else None
            if perf is not None:
                perf.start(f"drain-round-{round_}")
            cpu0 = procstats.cluster_cpu_seconds(postmaster)
            t0 = time.perf_counter()
            split = Split(postmaster)
            drained = await drain(store, args.batch, split)
            seconds = time.perf_counter() - t0
            cpu1 = procstats.cluster_cpu_seconds(postmaster)
            profile = perf.stop() if perf is not None else []
            async with pool.acquire() as conn:
                lsn1, wal1, fpi1 = await wal(conn)
            cpu.append((cpu1 - cpu0) / drained * 1e6)
            wal_per_job.append((wal1 - wal0) / drained)
            print(
                f"round {round_}: submit PG CPU {submit_cpu[-1]:.1f} us/job, "
                f"WAL {submit_wal[-1]:,.0f} B/job; "
                f"{drained} jobs drained in {seconds:.2f} s, PG CPU {cpu[-1]:.1f} us/job, "
                f"WAL {wal_per_job[-1]:,.0f} B/job, FPI {(fpi1 - fpi0) / drained:.3f}/job "
                f"(claims {split.claim / drained * 1e6:.1f}, "
                f"completions {split.complete / drained * 1e6:.1f} us/job)",
                flush=True,
            )
            for line in profile:
                print(line)
            if last and args.statements:
                async with pool.acquire() as conn:
                    print(await statements(conn, drained))
        print(
            f"median: submit PG CPU {statistics.median(submit_cpu):.1f} us/job, "
            f"WAL {statistics.median(submit_wal):,.0f} B/job; "
            f"drain PG CPU {statistics.median(cpu):.1f} us/job, "
            f"WAL {statistics.median(wal_per_job):,.0f} B/job"
        )
        if args.waldump:
            async with pool.acquire() as conn:
                print(await wal_by_record(conn, lsn0, lsn1, drained))
        if args.widths:
            async with pool.acquire() as conn:
                print(await widths(conn))
    finally:
        await store.close()
        await pool.close()


async def track_statements(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for setting in (
            "shared_preload_libraries = 'pg_stat_statements'",
            "pg_stat_statements.track = 'all'",
            "pg_stat_statements.track_planning = on",
            "track_functions = 'all'",
        ):
            await conn.execute(f"ALTER SYSTEM SET {setting}")
    finally:
        await conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs drained per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=100, help="claim max_jobs and ack batch")
    parser.add_argument("--history", type=int, default=20_000, help="finished jobs loaded first")
    parser.add_argument(
        "--running", type=int, default=0, help="jobs held RUNNING in another queue meanwhile"
    )
    parser.add_argument(
        "--what-if", help="SQL run after the migrations (a what-if, e.g. dropping an index)"
    )
    parser.add_argument("--waldump", action="store_true", help="WAL of the last round by type")
    parser.add_argument(
        "--widths", action="store_true", help="bytes per column of the drained jobs' rows"
    )
    parser.add_argument(
        "--payload-bytes", type=int, default=0, help="pad each drained job's payload by ~N B"
    )
    parser.add_argument("--perf", type=Path, help="perf record the last drain into this folder")
    parser.add_argument(
        "--statements", action="store_true", help="pg_stat_statements of the last drain"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evora-drain-pg-") as tmp:
        data_dir = Path(tmp) / "data"
        with LocalPostgres(data_dir, durable=True, log_path=Path(tmp) / "postgres.log") as pg:
            if args.statements:
                asyncio.run(track_statements(pg.dsn("postgres")))
                pg.stop()
                pg.start()
            postmaster = procstats.postmaster_pid(data_dir)
            assert postmaster is not None
            asyncio.run(run(args, pg.dsn("postgres"), postmaster, data_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
