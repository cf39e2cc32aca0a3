"""Soak of retention under a steady load: table sizes and dead tuples over time.

Not a test: it measures and prints. It starts its own PostgreSQL 18 (`LocalPostgres`,
durable: fsync and synchronous_commit on) in a temporary directory, migrates a fresh
database with job_events partitioned into short partitions, and then, for `--minutes`:

- a producer submits `--rate` jobs a second (batches of `--batch`, paced each second);
- workers claim and complete them (`JobStore.claim`, `complete_many`);
- a stand-in projector records, every 2 s, that it consumed everything committed
  (`record_projector_progress` with the current snapshot): a projector that keeps up, so
  what this measures is retention's own bound, not a projector's lag;
- the sweeper's retention pass (`Sweeper.prune_due`, as the leading sweeper runs it) every
  `--retention-every` seconds, with short windows: finished jobs `--jobs-window`, events
  `--events-window`, partitions of `--partition-seconds`, archiving off (no pipeline);
- autovacuum as configured by default.

Every `--sample-every` seconds it records, per table of the schema `evora` (a partitioned
table as the sum of its partitions; the outbox is two, `job_event_rows` and `event_batches`,
migration 0064), the total size (heap, indexes, TOAST), live and dead tuples
(pg_stat_user_tables), and prints the table of samples at the end. Results are described
in docs/benchmarks.md.

    python -m bench.retention_soak                       # 10 minutes at 100 jobs/s
    python -m bench.retention_soak --minutes 30 --rate 145
    python -m bench.retention_soak --minutes 1 --rate 20  # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from evora.embedded import LocalPostgres
from evora.http.metrics import ServiceMetrics
from evora.protocol.jobs import JobSubmission
from evora.protocol.states import JobState
from evora.storage.db import create_pool
from evora.storage.jobs import Completion, JobStore
from evora.storage.migrate import apply_migrations
from evora.storage.retention import RetentionStore, record_projector_progress
from evora_services.sweeper.metrics import SweeperMetrics
from evora_services.sweeper.sweeper import Retention, Sweeper, Tuning

# Per table of Evora's: partitions counted with their parent (pg_partition_root).
SIZES = """
SELECT coalesce(pg_partition_root(c.oid), c.oid)::regclass::text AS name,
       sum(pg_total_relation_size(c.oid))::int8 AS bytes,
       sum(coalesce(s.n_live_tup, 0))::int8 AS live,
       sum(coalesce(s.n_dead_tup, 0))::int8 AS dead,
       count(*)::int AS parts
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.relnamespace = 'evora'::regnamespace AND c.relkind = 'r'
GROUP BY 1 ORDER BY 1
"""


# The outbox's tables (migration 0064), whose partitions retention removes a range at a time:
# the events written one by one, and the batches (a row per statement).
EVENT_TABLES = ("job_event_rows", "event_batches")


@dataclass
class Sample:
    elapsed: float
    jobs_done: int
    tables: dict[str, tuple[int, int, int, int]]  # bytes, live, dead, partitions


@dataclass
class Counts:
    submitted: int = 0
    completed: int = 0


async def produce(store: JobStore, rate: int, batch: int, until: float, counts: Counts) -> None:
    n = 0
    while (now := time.monotonic()) < until:
        second = now + 1.0
        for _ in range(max(1, rate // batch)):
            subs = [
                JobSubmission(queue="soak", type="t", payload={"i": n + i}) for i in range(batch)
            ]
            await store.submit_batch(subs, with_jobs=False)
            n += batch
            counts.submitted += batch
        await asyncio.sleep(max(0.0, second - time.monotonic()))


async def work(store: JobStore, name: str, until: float, counts: Counts) -> None:
    while time.monotonic() < until:
        jobs = await store.claim(worker_id=name, queues=["soak"], max_jobs=50)
        if not jobs:
            await asyncio.sleep(0.05)
            continue
        await store.complete_many([Completion(j["id"], j["lease_token"]) for j in jobs])
        counts.completed += len(jobs)


async def project(pool: asyncpg.Pool, until: float) -> None:
    while time.monotonic() < until:
        snapshot = await pool.fetchval("SELECT pg_current_snapshot()::text")
        await record_projector_progress(pool, 1, snapshot, True)
        await asyncio.sleep(2.0)


async def sweep(sweeper: Sweeper, every: float, until: float) -> None:
    while time.monotonic() < until:
        removed = await sweeper.prune_due()
        print(f"  retention pass: {dict(removed)}", flush=True)
        await asyncio.sleep(every)


async def sample(
    pool: asyncpg.Pool, every: float, started: float, until: float, counts: Counts
) -> list[Sample]:
    samples: list[Sample] = []
    while True:
        rows = await pool.fetch(SIZES)
        tables = {
            r["name"].removeprefix("evora."): (r["bytes"], r["live"], r["dead"], r["parts"])
            for r in rows
        }
        samples.append(Sample(time.monotonic() - started, counts.completed, tables))
        events = " ".join(
            f"{t} {size / 2**20:.1f} MiB live={live} dead={dead} parts={parts};"
            for t in EVENT_TABLES
            for size, live, dead, parts in [tables.get(t, (0, 0, 0, 0))]
        )
        jobs = tables.get("jobs", (0, 0, 0, 0))
        print(
            f"  t={samples[-1].elapsed:6.0f}s done={counts.completed} {events} "
            f"jobs {jobs[0] / 2**20:.1f} MiB live={jobs[1]} dead={jobs[2]}",
            flush=True,
        )
        if time.monotonic() >= until:
            return samples
        await asyncio.sleep(every)


def report(samples: list[Sample], seconds: float, counts: Counts) -> None:
    names = sorted({name for s in samples for name in s.tables})
    busy = [n for n in names if any(s.tables.get(n, (0, 0, 0, 0))[0] > 65536 for s in samples)]
    print(f"\njobs submitted {counts.submitted}, completed {counts.completed} in {seconds:.0f} s")
    print(f"({counts.completed / seconds:.1f} jobs/s completed)\n")
    header = " | ".join(f"{n} MiB / dead" for n in busy)
    # a range of the outbox is a partition of each of its tables
    print(f"| t (s) | {header} | outbox partitions |")
    print("|" + " --- |" * (len(busy) + 2))
    for s in samples:
        cells = []
        for n in busy:
            size, _, dead, _ = s.tables.get(n, (0, 0, 0, 0))
            cells.append(f"{size / 2**20:.1f} / {dead}")
        parts = s.tables.get(EVENT_TABLES[0], (0, 0, 0, 0))[3]
        print(f"| {s.elapsed:.0f} | " + " | ".join(cells) + f" | {parts} |")
    print("\nmaximum over the run (MiB / dead tuples):")
    for n in busy:
        size = max(s.tables.get(n, (0, 0, 0, 0))[0] for s in samples)
        dead = max(s.tables.get(n, (0, 0, 0, 0))[2] for s in samples)
        print(f"  {n}: {size / 2**20:.1f} MiB, {dead} dead")


async def soak(dsn: str, args: argparse.Namespace) -> None:
    await apply_migrations(
        dsn, event_partition_seconds=args.partition_seconds, event_partitions_ahead=3
    )
    pool = await create_pool(dsn, min_size=4, max_size=8)
    try:
        store = JobStore(pool)
        windows = Retention(
            jobs=dict.fromkeys(
                (JobState.COMPLETED, JobState.CANCELLED, JobState.DLQ), args.jobs_window
            ),
            idempotency_keys=args.jobs_window,
            events=args.events_window,
            archive_events=False,
            event_partition_seconds=args.partition_seconds,
            event_partitions_ahead=3,
        )
        sweeper = Sweeper(
            store,
            RetentionStore(pool),
            SweeperMetrics(ServiceMetrics("sweeper")),
            windows,
            Tuning(),
        )
        counts = Counts()
        started = time.monotonic()
        until = started + args.minutes * 60
        sampling = asyncio.create_task(sample(pool, args.sample_every, started, until, counts))
        await asyncio.gather(
            produce(store, args.rate, args.batch, until, counts),
            *(work(store, f"w{i}", until, counts) for i in range(2)),
            project(pool, until),
            sweep(sweeper, args.retention_every, until),
        )
        report(await sampling, time.monotonic() - started, counts)
    finally:
        await pool.close()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.retention_soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=100, help="jobs submitted a second")
    parser.add_argument("--batch", type=int, default=25, help="jobs per submit_batch")
    parser.add_argument("--jobs-window", type=float, default=60.0)
    parser.add_argument("--events-window", type=float, default=120.0)
    parser.add_argument("--partition-seconds", type=int, default=60)
    parser.add_argument("--retention-every", type=float, default=15.0)
    parser.add_argument("--sample-every", type=float, default=30.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="evora-soak-") as tmp,
        LocalPostgres(Path(tmp) / "data", durable=True) as pg,
    ):
        asyncio.run(soak(pg.dsn("postgres"), args))


if __name__ == "__main__":
    main()
