"""What-if: finished jobs leave `jobs` for `finished_jobs`, partitioned by day of finished_at,
and retention drops a day's partition instead of deleting rows (issue #33 items 2 and 3).

Not a test, and nothing here is production code: each shape is SQL applied after the
migrations to a database of its own. One PostgreSQL cluster (`LocalPostgres`, durable), one
database per shape, the rounds interleaved shape by shape. Per round and shape, on Evora's
clock moved a day ahead (so the round's jobs finish in a day of their own):

- `drain`: `--jobs` jobs submitted (batches of 1,000), a CHECKPOINT, then drained as
  bench.drain_pg drains them (one claim of `--batch`, one `complete_many` of that batch);
- `vacuum`: `VACUUM (ANALYZE false)` of `jobs` right after, what autovacuum does soon about
  the dead rows the drain left there (autovacuum is off in the cluster, so none of it falls
  into a measured phase);
- `retention`: a CHECKPOINT first (retention comes a day after the drain, with checkpoints
  between), then what removes the round's jobs: today, the sweeper's evora.prune_finished()
  with the window 0, batches of 1,000 (the sweeper's `prune_batch`) until one removes none;
  a moved shape, the count of the partition's jobs into job_prune_counts and the drop of the
  partition, in odd rounds a plain `DROP TABLE`, in even ones `ALTER TABLE ... DETACH
  PARTITION ... CONCURRENTLY` and then the drop;
- `vacuum 2`: the same vacuum again, after retention's deletes.

Each phase: WAL bytes (exact), of them the full-page images' (pg_walinspect), and the
cluster's CPU (every PostgreSQL process, /proc), per job. The shapes (`--shapes`):

- `today`: the migrations as they are (UPDATE in place, row-by-row retention);
- `plpgsql-pk`, `plpgsql-listing`: the completion DELETEs the job from `jobs` ... RETURNING
  it and INSERTs it into `finished_jobs`, the finished row built by a PL/pgSQL function per
  job (the earlier what-if's way, docs/benchmarks/2026-11-29-pending-index-heartbeats-
  finished-jobs.md section 3); `-pk`: each partition has a primary key on id and nothing
  else, `-listing`: and the listing's two indexes, (queue, state, submit_seq) and submit_seq;
- `sql-pk`, `sql-listing`: the same, the finished row built in the statement (one DELETE ...
  RETURNING feeding one INSERT, no PL/pgSQL per row);
- `sql-pk-nofk`: `sql-pk` without the four foreign keys that referenced jobs ON DELETE CASCADE
  (what their checks cost a completion that deletes), and without the statement trigger that
  replaced them in migration 0061 (since which `sql-pk` has no foreign keys either).

`--lock-probe S`: afterwards, in the `sql-pk` database, whether a partition's DROP stalls the
completions: a session reads `finished_jobs` and stays in its transaction for S seconds while
the drop of an old partition starts, and a completion is timed meanwhile; once with `DROP
TABLE`, once with `DETACH ... CONCURRENTLY` then the drop. `--id-probe N`: then a read of a
finished job by id over N day partitions (each partition's primary key probed, or only those
the id's time allows).

    python -m bench.finished_partitions --rounds 6 --jobs 10000 --lock-probe 2 --id-probe 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from bench import procstats
from bench.drain_pg import QUEUE, drain, submit, wal_by_record
from evora.embedded import LocalPostgres
from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import Completion, JobStore
from evora.storage.migrate import apply_migrations

DAY = 86_400
SHAPES = ("today", "plpgsql-pk", "plpgsql-listing", "sql-pk", "sql-listing", "sql-pk-nofk")

# The table the moved shapes finish into: the columns of `jobs`, partitioned by day of
# finished_at, no default partition (it would make DETACH ... CONCURRENTLY impossible).
FINISHED_TABLE = """
CREATE TABLE evora.finished_jobs (LIKE evora.jobs) PARTITION BY RANGE (finished_at);
ALTER TABLE evora.jobs DISABLE TRIGGER jobs_live_delete_guard;
"""
LISTING_INDEXES = """
CREATE INDEX finished_jobs_listing ON evora.finished_jobs (queue, state, submit_seq);
CREATE INDEX finished_jobs_submit_seq ON evora.finished_jobs (submit_seq);
"""
# The foreign keys are gone since migration 0061 (IF EXISTS), replaced by a statement trigger
# that this drops too: the move with nothing removing a deleted job's references.
NO_FOREIGN_KEYS = """
ALTER TABLE evora.callbacks DROP CONSTRAINT IF EXISTS callbacks_job_id_fkey;
ALTER TABLE evora.job_dependencies DROP CONSTRAINT IF EXISTS job_dependencies_job_id_fkey;
ALTER TABLE evora.job_traces DROP CONSTRAINT IF EXISTS job_traces_job_id_fkey;
ALTER TABLE evora.spawned_children DROP CONSTRAINT IF EXISTS spawned_children_parent_fkey;
DROP TRIGGER IF EXISTS jobs_references_removed ON evora.jobs;
"""
# The finished row, built per job in PL/pgSQL.
FINISHED_ROW = """
CREATE FUNCTION evora.finished_row(j evora.jobs, res jsonb) RETURNS evora.jobs
LANGUAGE plpgsql AS $$
BEGIN
    j.state := 'COMPLETED';
    j.result := res;
    j.lease_expires_at := NULL;
    j.finished_at := evora.clock_now();
    j.updated_at := evora.clock_now();
    j.version := j.version + 1;
    RETURN j;
END
$$;
"""
# evora.complete_items()'s `moved` step (an UPDATE in place) rewritten: the job leaves `jobs`
# and enters `finished_jobs`; `moved` then yields what it yields today, from the new row.
# `{kept}` is the INSERT's SELECT, per shape.
MOVE = """
DO $do$
DECLARE
    body text;
    cols text;
BEGIN
    SELECT string_agg(CASE a.attname
               WHEN 'state' THEN '''COMPLETED''::evora.job_state'
               WHEN 'result' THEN 'g.new_result'
               WHEN 'lease_expires_at' THEN 'NULL'
               WHEN 'finished_at' THEN 'evora.clock_now()'
               WHEN 'updated_at' THEN 'evora.clock_now()'
               WHEN 'version' THEN 'g.version + 1'
               ELSE 'g.' || quote_ident(a.attname) END, ', ' ORDER BY a.attnum)
    INTO cols
    FROM pg_attribute a
    WHERE a.attrelid = 'evora.jobs'::regclass AND a.attnum > 0 AND NOT a.attisdropped;
    body := pg_get_functiondef(
        'evora.complete_items(uuid[], uuid[], jsonb[], text[], boolean)'::regprocedure);
    body := regexp_replace(body, 'moved AS \\(\\s*UPDATE evora\\.jobs j.*?AS noted\\s*\\),', $m$
    gone AS (
        DELETE FROM evora.jobs j USING input i
        WHERE j.id = i.id AND j.lease_token = i.token AND j.state = i.fenced
        RETURNING j.*, j AS was, i.result AS new_result
    ),
    kept AS (
        INSERT INTO evora.finished_jobs {kept}
        RETURNING *
    ),
    moved AS (
        SELECT k.id, k.lease_token, ROW(k.*)::evora.jobs AS job, k.version, k.queue, k.type,
               k.attempt, k.worker_id, k.updated_at, pg_column_size(k.result) AS result_bytes,
               evora.event_image(ROW(k.*)::evora.jobs, 'RUNNING') AS image,
               k.group_key IS NOT NULL OR k.limited OR k.fairness_key IS NOT NULL AS noted
        FROM kept k
    ),$m$);
    IF body NOT LIKE '%kept AS%' THEN
        RAISE EXCEPTION 'what-if: the completion was not rewritten';
    END IF;
    body := replace(body, '<cols>', cols);
    EXECUTE body;
END
$do$;
"""
KEPT_PLPGSQL = (
    "SELECT (x.job).* FROM gone g"
    " CROSS JOIN LATERAL (SELECT evora.finished_row(g.was, g.new_result) AS job OFFSET 0) x"
)
KEPT_SQL = "SELECT <cols> FROM gone g"


def what_if(shape: str) -> str:
    if shape == "today":
        return ""
    kept = KEPT_PLPGSQL if shape.startswith("plpgsql") else KEPT_SQL
    return "\n".join(
        [
            FINISHED_TABLE,
            LISTING_INDEXES if shape.endswith("listing") else "",
            NO_FOREIGN_KEYS if shape.endswith("nofk") else "",
            FINISHED_ROW,
            MOVE.replace("{kept}", kept),
        ]
    )


async def make_day_partition(conn: asyncpg.Connection) -> str:
    """The partition of finished_jobs for the day Evora's clock is in, made on its own (with
    its primary key) and then attached, as evora.make_event_partitions() makes job_events'."""
    day = await conn.fetchval("SELECT date_trunc('day', evora.clock_now() AT TIME ZONE 'UTC')")
    name = f"finished_jobs_p{day:%Y%m%d}"
    await conn.execute(
        f"CREATE TABLE evora.{name} (LIKE evora.finished_jobs);"
        f" ALTER TABLE evora.{name} ADD PRIMARY KEY (id);"
        f" ALTER TABLE evora.finished_jobs ATTACH PARTITION evora.{name}"
        f" FOR VALUES FROM ('{day:%Y-%m-%d} UTC') TO ('{day:%Y-%m-%d} UTC'::timestamptz"
        " + interval '1 day')"
    )
    return name


@dataclass
class Phase:
    wal: float
    fpi: float  # bytes of full-page images
    cpu_us: float


async def wal(conn: asyncpg.Connection) -> tuple[str, int, int]:
    """The WAL's insert position (as bench.drain_pg.wal(), whose pg_current_wal_lsn() is the
    position written out so far: enough after commits, which flush, but a VACUUM's records
    wait in the WAL buffers until something writes them)."""
    row = await conn.fetchrow(
        "SELECT pg_current_wal_insert_lsn()::text AS lsn,"
        " pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::int8 AS bytes"
    )
    assert row is not None
    return row["lsn"], row["bytes"], 0


async def fpi_bytes(conn: asyncpg.Connection, start: str, end: str) -> int:
    """The full-page images' bytes between two LSNs, read from the WAL itself (pg_stat_wal
    lags: a backend reports its counts at its next stats flush). pg_walinspect reads only
    flushed WAL, and a VACUUM's records may not be yet: a message written with `flush`, after
    `end`, flushes them (a transaction that wrote nothing before its commit record does not
    flush at commit)."""
    if await conn.fetchval("SELECT $2::text::pg_lsn - $1::text::pg_lsn", start, end) < 1024:
        # (< 0.1 B per job: a range of a few bytes, a VACUUM with nothing to do, may hold no
        # record start at all, which pg_walinspect refuses)
        return 0
    await conn.fetchval("SELECT pg_logical_emit_message(false, 'bench', 'flush', true)")
    return int(
        await conn.fetchval(
            "SELECT coalesce(sum(fpi_size), 0) FROM"
            " pg_get_wal_stats($1::text::pg_lsn, $2::text::pg_lsn)",
            start,
            end,
        )
    )


class Shape:
    def __init__(self, name: str, admin_dsn: str, dsn: str) -> None:
        self.name = name
        self.admin_dsn = admin_dsn
        self.dsn = dsn
        self.database = name.replace("-", "_")
        self.partition = ""
        self.phases: dict[str, list[Phase]] = defaultdict(list)

    async def set_clock(self, days: int) -> None:
        admin = await asyncpg.connect(self.admin_dsn)
        try:
            await admin.execute(
                f"ALTER DATABASE {self.database} SET evora.clock_offset = '{days} days'"
            )
        finally:
            await admin.close()
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute("SELECT evora.make_event_partitions($1, 3)", float(DAY))
            if self.name != "today":
                self.partition = await make_day_partition(conn)
        finally:
            await conn.close()

    async def setup(self, history: int, batch: int) -> None:
        await apply_migrations(self.dsn)
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            sql = what_if(self.name)
            if sql:
                await conn.execute(sql)
        finally:
            await conn.close()
        await self.set_clock(0)
        await self.with_store(lambda s: self.history(s, history))
        conn = await asyncpg.connect(self.dsn)
        try:
            await self.retention(conn, batch, detach=False)
        finally:
            await conn.close()

    @staticmethod
    async def history(store: JobStore, jobs: int) -> None:
        await submit(store, jobs)
        await drain(store, 1000)

    async def with_store(self, work: Callable[[JobStore], Awaitable[None]]) -> None:
        pool = await create_pool(self.dsn, min_size=2, max_size=2)
        store = JobStore(pool)
        try:
            await work(store)
        finally:
            await store.close()
            await pool.close()

    async def retention(self, conn: asyncpg.Connection, batch: int, *, detach: bool) -> int:
        """Removes every finished job of the shape: returns how many went (today) or 0. On
        the caller's connection: a backend that exits while the cluster's CPU is read takes
        its CPU time out of the count until the postmaster reaps it."""
        if self.name == "today":
            removed = 0
            while n := await conn.fetchval(
                "SELECT evora.prune_finished(0, $1, 'COMPLETED')", batch
            ):
                removed += n
            return removed
        if detach:
            await conn.execute(
                f"ALTER TABLE evora.finished_jobs DETACH PARTITION evora.{self.partition}"
                " CONCURRENTLY"
            )
        # job_prune_counts keeps its promise (the read models match the true counts per
        # state): the partition's jobs counted by queue and state, one read of it whole,
        # before it goes
        await conn.execute(
            "INSERT INTO evora.job_prune_counts AS c (queue, state, pruned)"
            f" SELECT f.queue, f.state, count(*) FROM evora.{self.partition} f"
            " GROUP BY f.queue, f.state ORDER BY f.queue, f.state"
            " ON CONFLICT (queue, state) DO UPDATE SET pruned = c.pruned + excluded.pruned"
        )
        await conn.execute(f"DROP TABLE evora.{self.partition}")
        return 0

    async def round(self, round_: int, args: argparse.Namespace, postmaster: int) -> None:
        await self.set_clock(round_)
        conn = await asyncpg.connect(self.dsn)
        try:

            async def phase(
                name: str, work: Awaitable[object], jobs: int, checkpoint: bool
            ) -> None:
                if checkpoint:
                    await conn.execute("CHECKPOINT")
                l0, w0, _ = await wal(conn)
                c0 = procstats.cluster_cpu_seconds(postmaster)
                await work
                c1 = procstats.cluster_cpu_seconds(postmaster)
                l1, w1, _ = await wal(conn)
                fpi = await fpi_bytes(conn, l0, l1)
                self.phases[name].append(
                    Phase((w1 - w0) / jobs, fpi / jobs, (c1 - c0) / jobs * 1e6)
                )

            drained: list[int] = []

            async def submit_and_drain(store: JobStore) -> None:
                await submit(store, args.jobs)
                await conn.execute("CHECKPOINT")
                l0, w0, _ = await wal(conn)
                c0 = procstats.cluster_cpu_seconds(postmaster)
                drained.append(await drain(store, args.batch))
                c1 = procstats.cluster_cpu_seconds(postmaster)
                l1, w1, _ = await wal(conn)
                fpi = await fpi_bytes(conn, l0, l1)
                self.phases["drain"].append(
                    Phase((w1 - w0) / args.jobs, fpi / args.jobs, (c1 - c0) / args.jobs * 1e6)
                )
                if args.waldump and round_ == args.rounds:
                    print(f"the drain's WAL, {self.name}, round {round_}:")
                    print(await wal_by_record(conn, l0, l1, args.jobs), flush=True)

            await self.with_store(submit_and_drain)
            assert drained == [args.jobs], (self.name, drained)
            if self.name != "today":
                moved = await conn.fetchval(f"SELECT count(*) FROM evora.{self.partition}")
                assert moved == args.jobs, (self.name, moved)
            vacuum = "VACUUM (ANALYZE false) evora.jobs"
            await phase("vacuum", conn.execute(vacuum), args.jobs, checkpoint=False)
            await phase(
                "retention",
                self.retention(conn, args.prune_batch, detach=round_ % 2 == 0),
                args.jobs,
                checkpoint=True,
            )
            left = await conn.fetchval("SELECT count(*) FROM evora.jobs WHERE queue = $1", QUEUE)
            assert left == 0, (self.name, left)
            await phase("vacuum 2", conn.execute(vacuum), args.jobs, checkpoint=False)
        finally:
            await conn.close()
        last = {k: v[-1] for k, v in self.phases.items()}
        print(
            f"round {round_} {self.name:<16} "
            + "; ".join(
                f"{k} WAL {p.wal:,.0f} B (FPI {p.fpi:,.0f}) CPU {p.cpu_us:.1f} us"
                for k, p in last.items()
            )
            + (
                f" ({'DETACH CONCURRENTLY + ' if round_ % 2 == 0 else ''}DROP)"
                if self.name != "today"
                else ""
            ),
            flush=True,
        )


async def complete_one(store: JobStore) -> float:
    """Claims one job and completes it: the completion's seconds."""
    jobs = await store.claim(worker_id="probe", queues=[QUEUE], max_jobs=1)
    t0 = time.perf_counter()
    await store.complete_many(
        [Completion(j["id"], j["lease_token"]) for j in jobs], with_jobs=False
    )
    return time.perf_counter() - t0


async def lock_probe(shape: Shape, hold: float) -> None:
    """Whether retention's drop of a partition stalls the completions while a reader of
    finished_jobs stays in its transaction: a completion's time, alone and during the drop."""
    for days, detach in ((100, False), (110, True)):
        await shape.set_clock(days)
        old = shape.partition
        await shape.set_clock(days + 1)
        reader = await asyncpg.connect(shape.dsn)
        dropper = await asyncpg.connect(shape.dsn)
        pool = await create_pool(shape.dsn, min_size=2, max_size=2)
        store = JobStore(pool)
        try:
            await store.submit_batch([JobSubmission(queue=QUEUE, type="noop")] * 4)

            alone = await complete_one(store)
            await reader.execute("BEGIN")
            await reader.fetchval("SELECT count(*) FROM evora.finished_jobs")
            shape.partition = old
            dropping = asyncio.ensure_future(shape.retention(dropper, 1000, detach=detach))
            await asyncio.sleep(0.3)
            during = asyncio.ensure_future(complete_one(store))
            await asyncio.sleep(hold)
            await reader.execute("COMMIT")
            waited = await during
            await dropping
            print(
                f"lock probe ({'DETACH CONCURRENTLY + DROP' if detach else 'DROP TABLE'},"
                f" a reader in its transaction for {hold:.0f} s): a completion took"
                f" {alone * 1e3:.1f} ms alone, {waited * 1e3:.1f} ms during the drop",
                flush=True,
            )
        finally:
            await store.close()
            await pool.close()
            await reader.close()
            await dropper.close()


# Copies of a partition's rows (`{source}`) into the partition of the clock's day, with new
# ids made now (uuid7s, as submissions' are), finished an hour later.
COPY_DAY = """
DO $do$
DECLARE
    cols text;
BEGIN
    SELECT string_agg(CASE a.attname
               WHEN 'id' THEN 'evora.uuid7()'
               WHEN 'finished_at' THEN 'evora.clock_now() + interval ''1 hour'''
               ELSE 'f.' || quote_ident(a.attname) END, ', ' ORDER BY a.attnum)
    INTO cols
    FROM pg_attribute a
    WHERE a.attrelid = 'evora.finished_jobs'::regclass AND a.attnum > 0
      AND NOT a.attisdropped;
    EXECUTE format('INSERT INTO evora.finished_jobs SELECT %s FROM evora.%I f', cols, '{source}');
END
$do$
"""
# The time a uuid7 was made: its first 48 bits, milliseconds since the epoch.
UUID7_TIME = (
    "to_timestamp((('x' || lpad(replace(left($1::text, 13), '-', ''), 16, '0'))"
    "::bit(64)::int8) / 1000.0)"
)


async def id_probe(shape: Shape, days: int, jobs: int) -> None:
    """What a read of a finished job by id costs with `days` daily partitions of `jobs` jobs
    each (a primary key per partition, no index across them): EXPLAIN ANALYZE, median of 7,
    of the read of an id in the newest partition, in the oldest, of one in none, and of the
    newest one's read with the partitions before its id's time pruned (`finished_at` >= the
    uuid7's time: a job finishes after it is submitted)."""
    await shape.set_clock(200)
    first = shape.partition
    await shape.with_store(lambda s: Shape.history(s, jobs))
    for day in range(201, 200 + days):
        await shape.set_clock(day)
        conn = await asyncpg.connect(shape.dsn)  # a new session sees the clock's new day
        try:
            await conn.execute(COPY_DAY.replace("{source}", first))
        finally:
            await conn.close()
    conn = await asyncpg.connect(shape.dsn)
    try:
        await conn.execute("ANALYZE evora.finished_jobs")
        newest = await conn.fetchval(f"SELECT id FROM evora.{shape.partition} LIMIT 1")
        oldest = await conn.fetchval(f"SELECT id FROM evora.{first} LIMIT 1")
        by_id = "SELECT * FROM evora.finished_jobs WHERE id = $1"
        reads = {
            "newest": (by_id, newest),
            "oldest": (by_id, oldest),
            "missing": (by_id, "00000000-0000-7000-8000-000000000000"),
            "newest, pruned by the id's time": (
                # (plus how far Evora's clock runs ahead, as the rows' finished_at does)
                f"{by_id} AND finished_at >= {UUID7_TIME} + (evora.clock_now() - now())",
                newest,
            ),
        }
        for name, (sql, value) in reads.items():
            await conn.execute(f"PREPARE probe(uuid) AS {sql}")
            plans = [
                json.loads(
                    await conn.fetchval(
                        f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE probe('{value}')"
                    )
                )[0]
                for _ in range(7)
            ]
            await conn.execute("DEALLOCATE probe")
            print(
                f"id probe, {days} partitions of {jobs:,} jobs, {name}: execution"
                f" {statistics.median(p['Execution Time'] for p in plans):.3f} ms, planning"
                f" {statistics.median(p.get('Planning Time', 0.0) for p in plans):.3f} ms,"
                f" {plans[-1]['Plan'].get('Shared Hit Blocks', 0)} buffers,"
                f" {plans[-1]['Plan'].get('Actual Rows')} rows",
                flush=True,
            )
    finally:
        await conn.close()


async def run(args: argparse.Namespace, pg: LocalPostgres, postmaster: int) -> None:
    admin = await asyncpg.connect(pg.dsn("postgres"))
    try:
        for name in args.shapes:
            await admin.execute(f"CREATE DATABASE {name.replace('-', '_')}")
    finally:
        await admin.close()
    shapes = [
        Shape(name, pg.dsn("postgres"), pg.dsn(name.replace("-", "_"))) for name in args.shapes
    ]
    for shape in shapes:
        await shape.setup(args.history, args.prune_batch)
    for round_ in range(1, args.rounds + 1):
        for shape in shapes:
            await shape.round(round_, args, postmaster)
    print("medians per job (WAL B (of it full-page images), PostgreSQL CPU us):")
    for shape in shapes:
        print(
            f"  {shape.name:<16} "
            + "; ".join(
                f"{k} {statistics.median(p.wal for p in v):,.0f} B"
                f" ({statistics.median(p.fpi for p in v):,.0f})"
                f" {statistics.median(p.cpu_us for p in v):.1f} us"
                for k, v in shape.phases.items()
            )
        )
    probe = next((s for s in shapes if s.name == "sql-pk"), None)
    if probe is not None and args.lock_probe:
        await lock_probe(probe, args.lock_probe)
    if probe is not None and args.id_probe:
        await id_probe(probe, args.id_probe, args.jobs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs drained per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=100, help="claim max_jobs and ack batch")
    parser.add_argument("--history", type=int, default=20_000, help="finished jobs loaded first")
    parser.add_argument("--prune-batch", type=int, default=1000, help="prune_finished's batch")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument(
        "--waldump", action="store_true", help="the last drain's WAL by record, per shape"
    )
    parser.add_argument(
        "--id-probe", type=int, default=0, help="days of partitions for the id probe (0: none)"
    )
    parser.add_argument(
        "--lock-probe", type=float, default=0.0, help="seconds a reader holds (0: no probe)"
    )
    args = parser.parse_args()
    on_fresh_cluster("evora-finished-parts-", lambda pg, postmaster: run(args, pg, postmaster))
    return 0


def on_fresh_cluster(
    prefix: str, run: Callable[[LocalPostgres, int], Coroutine[Any, Any, None]]
) -> None:
    """`run(pg, postmaster pid)` on a durable PostgreSQL of its own with autovacuum off (every
    vacuum a measured phase), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        data_dir = Path(tmp) / "data"
        with LocalPostgres(data_dir, durable=True, log_path=Path(tmp) / "postgres.log") as pg:
            asyncio.run(autovacuum_off(pg.dsn("postgres")))
            postmaster = procstats.postmaster_pid(data_dir)
            assert postmaster is not None
            asyncio.run(run(pg, postmaster))


async def autovacuum_off(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("ALTER SYSTEM SET autovacuum = off")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


if __name__ == "__main__":
    sys.exit(main())
