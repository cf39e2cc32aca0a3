"""One repetition of the workloads for one system, the same for every system:

(a) enqueue: `jobs` no-op jobs through the system's batch API, `batch` per call, no worker
    running; jobs/s = jobs / (last call returned - first call made). Then drain: the worker
    starts and takes them all; jobs/s = jobs / (moment the database shows no unfinished job
    - first handler start). The database is polled every POLL_S for that moment.
(b) latency: the now idle worker waits `idle_s` (2 s unless told); a producer offers `rate`
    jobs/s for `seconds` (open loop, one job per call); latency = handler start - the
    producer's call returned (also reported from the call's start), both this machine's
    wall clock.
(c) CPU seconds per job of every process in each phase (/proc, or the runner's own count
    for the producers, which exit at the end of their phase), peak RSS of every process
    (VmHWM, or the runner's ru_maxrss) and PostgreSQL's peak private memory: the largest sum
    of RssAnon over all its processes, sampled every SAMPLE_S (shared_buffers left out).
(d) with `whole_life` (`bench.wholelife`): autovacuum off for the system's tables from the
    start, and after the latency run, every process of the system stopped, the work its
    finished jobs still leave (retention, the audit, vacuum), part by part: WAL bytes,
    PostgreSQL CPU, this process's CPU (the part's client side), wall time.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from bench import procstats, wholelife
from bench.children import Child
from bench.cluster import Cluster
from bench.profiling import Profiler
from bench.stats import distribution
from bench.system import System

POLL_S = 0.05
SAMPLE_S = 0.25
IDLE_BEFORE_OFFER_S = 2.0
LATENCY_FIRST_INDEX = 10_000_000  # latency jobs' payload i, apart from the drained ones
POSTGRES = "postgresql"
MONGO = "mongo-wire stand-in"
MACHINE = "(machine)"  # keys of a CPU snapshot that are no process of the system
WALL = "(wall)"
KIB_PER_MIB = 1024


@dataclass(frozen=True)
class Workload:
    jobs: int = 20_000
    batch: int = 1_000
    rate: float = 200.0
    seconds: float = 20.0
    drain_timeout_s: float = 600.0
    handler_ms: float = 0.0  # how long each handler takes (0: no-op jobs)
    # how long the worker waits idle between the drain and the latency run
    idle_s: float = IDLE_BEFORE_OFFER_S

    @classmethod
    def quick(cls) -> Workload:
        return cls(jobs=2_000, rate=100.0, seconds=3.0, drain_timeout_s=120.0)


class PeakSampler:
    """PostgreSQL's private memory (see `Cluster.anon_kib`), sampled in a thread."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.peak_kib = max(self.peak_kib, self.cluster.anon_kib())

    @contextmanager
    def running(self) -> Iterator[PeakSampler]:
        self.peak_kib = self.cluster.anon_kib()
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()


async def _wal_bytes(conn: asyncpg.Connection) -> int:
    """Where the cluster's WAL is now, in bytes (one system runs at a time): the insert
    position, not pg_current_wal_lsn(), which is only what has been written out so far (the
    same after commits, which flush, but a VACUUM's records can wait in the WAL buffers)."""
    position: int = await conn.fetchval(
        "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::int8"
    )
    return position


class Repetition:
    def __init__(
        self,
        system: System,
        cluster: Cluster,
        workload: Workload,
        label: str,
        profiler: Profiler | None,
        whole_life: bool = False,
    ) -> None:
        self.system = system
        self.cluster = cluster
        self.workload = workload
        self.label = label
        self.profiler = profiler
        self.whole_life = whole_life
        self._autovacuum_runs = 0
        self.directory = system.children.directory
        self.worker: Child | None = None
        self.result: dict[str, Any] = {"system": system.name, "label": label}

    # -- measurement helpers ---------------------------------------------------------------

    def _cpu(self) -> dict[str, float]:
        cpu = {
            POSTGRES: self.cluster.cpu(),
            MACHINE: procstats.machine_busy_seconds(),
            WALL: time.monotonic(),
        }
        for child in self.system.services:
            cpu[self._short(child)] = child.cpu()
        if self.worker is not None and self.worker.alive():
            cpu["worker"] = self.worker.cpu()
        mongo = self.cluster.mongo_pid
        if self.system.name.startswith("evora") and mongo is not None:
            cpu[MONGO] = procstats.cpu_seconds(mongo) or 0.0
        return cpu

    def _short(self, child: Child) -> str:
        return child.name.rsplit("-", 1)[-1]

    @staticmethod
    def _noise_cores(before: dict[str, float], after: dict[str, float]) -> float:
        """Cores the rest of the machine kept busy meanwhile (other people's work): all CPU
        time of the machine less that of this system's processes, over the wall time."""
        ours = sum(after[k] - before.get(k, 0.0) for k in after if k not in (MACHINE, WALL))
        seconds = after[WALL] - before[WALL]
        return max(0.0, after[MACHINE] - before[MACHINE] - ours) / seconds if seconds else 0.0

    @staticmethod
    def _per_job_us(
        before: dict[str, float], after: dict[str, float], jobs: int
    ) -> dict[str, float]:
        return {
            name: (after[name] - before.get(name, 0.0)) * 1e6 / max(jobs, 1)
            for name in after
            if name not in (MACHINE, WALL)
        }

    async def _wait_finished(self, conn: asyncpg.Connection, limit_s: float) -> float:
        """Polls until no job is unfinished; the wall clock of the poll that saw none."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            sent = time.time()
            if not await conn.fetchval(self.system.unfinished_sql):
                return sent
            await asyncio.sleep(POLL_S)
        raise RuntimeError(f"{self.system.name}: jobs still unfinished after {limit_s:.0f} s")

    def _out(self, name: str) -> Path:
        return self.directory / f"{self.system.name}-{self.label}-{name}.json"

    async def _run_producer(self, name: str, args: list[str]) -> dict[str, Any]:
        out = self._out(name)
        child = self.system.spawn_runner(f"{self.label}-{name}", [*args, "--out", str(out)])
        await child.wait_exit(self.workload.drain_timeout_s)
        data: dict[str, Any] = json.loads(out.read_text())
        return data

    async def _counters_delta(self, before: dict[str, float]) -> dict[str, float]:
        after = await self.system.counters()
        return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}

    async def _begin(self, conn: asyncpg.Connection, phase: str, targets: list[Child]) -> None:
        await self.cluster.reset_statements(conn)
        self._profile(phase, targets)

    def _profile(self, phase: str, targets: list[Child]) -> None:
        if self.profiler is not None:
            self.profiler.attach(f"{self.label}-{phase}", targets)

    def _profiles(self) -> dict[str, list[str]]:
        return {} if self.profiler is None else self.profiler.stop()

    # -- the phases --------------------------------------------------------------------------

    async def run(self, dsn: str) -> dict[str, Any]:
        await self.system.start(dsn, self.label)
        conn = await asyncpg.connect(dsn)
        try:
            if self.whole_life:
                await wholelife.autovacuum_off(conn, self.system.schemas)
                self._autovacuum_runs = await wholelife.autovacuum_runs(conn, self.system.schemas)
            with PeakSampler(self.cluster).running() as sampler:
                await self.cluster.execute("CHECKPOINT")
                await self._phases(conn)
                self._score(self._stop_and_collect(sampler))
            if self.whole_life:
                await self._deferred(conn, dsn)
        finally:
            await conn.close()
            if self.worker is not None:
                self.worker.stop()
            self.system.stop()
        return self.result

    async def _phases(self, conn: asyncpg.Connection) -> None:
        """What the system is measured doing; the worker, once started, is left running."""
        w = self.workload
        await self._enqueue(conn, w)
        await self._drain(conn, w)
        self.result["after_drain"] = await self.system.after_drain()
        await self._latency(conn, w)

    async def _enqueue(self, conn: asyncpg.Connection, w: Workload) -> None:
        counters = await self.system.counters()
        await self._begin(conn, "enqueue", self.system.profile_targets())
        before = self._cpu()
        wal_before = await _wal_bytes(conn)
        out = await self._run_producer(
            "enqueue", ["enqueue", "--count", str(w.jobs), "--batch", str(w.batch)]
        )
        after = self._cpu()
        wal = await _wal_bytes(conn) - wal_before
        after["producer"] = out["cpu_seconds"]
        cpu = self._per_job_us(before, after, w.jobs)
        seconds = out["t_end"] - out["t_start"]
        self.result["enqueue"] = {
            "jobs": w.jobs,
            "seconds": seconds,
            "jobs_per_s": w.jobs / seconds,
            "cpu_us_per_job": cpu,
            "noise_cores": self._noise_cores(before, after),
            "wal_bytes": wal,
            "counters": await self._counters_delta(counters),
            "profiles": self._profiles(),
            "statements": await self.cluster.top_statements(conn),
        }
        self.result.setdefault("peak_rss_mib", {})["producer (enqueue)"] = (
            out["maxrss_kib"] / KIB_PER_MIB
        )

    async def _drain(self, conn: asyncpg.Connection, w: Workload) -> None:
        counters = await self.system.counters()
        await self._begin(conn, "drain", self.system.profile_targets())
        self.worker = self.system.spawn_runner(
            f"{self.label}-worker",
            ["work", "--out", str(self._out("worker")), "--handler-ms", str(w.handler_ms)],
        )
        await self.worker.wait_ready_line()
        self._profile("drain", [self.worker])
        perf = self.cluster.perf
        if perf is not None:
            # the whole machine: the system may open connections during the drain
            perf.start(f"{self.system.name}-{self.label}-drain", system_wide=True)
        before = self._cpu()
        wal_before = await _wal_bytes(conn)
        finished_at = await self._wait_finished(conn, w.drain_timeout_s)
        after = self._cpu()
        wal = await _wal_bytes(conn) - wal_before
        if perf is not None:
            self.result["drain_perf"] = perf.stop()
        self.result["drain"] = {
            "jobs": w.jobs,
            "finished_at": finished_at,
            "cpu_us_per_job": self._per_job_us(before, after, w.jobs),
            "noise_cores": self._noise_cores(before, after),
            "wal_bytes": wal,
            "counters": await self._counters_delta(counters),
            "profiles": self._profiles(),
            "statements": await self.cluster.top_statements(conn),
        }

    async def _latency(self, conn: asyncpg.Connection, w: Workload) -> None:
        await asyncio.sleep(w.idle_s)
        assert self.worker is not None
        counters = await self.system.counters()
        await self._begin(conn, "latency", [*self.system.profile_targets(), self.worker])
        before = self._cpu()
        wal_before = await _wal_bytes(conn)
        out = await self._run_producer(
            "offer",
            [
                "offer",
                "--rate",
                str(w.rate),
                "--seconds",
                str(w.seconds),
                "--first",
                str(LATENCY_FIRST_INDEX),
            ],
        )
        await self._wait_finished(conn, w.drain_timeout_s)
        sent = out["sent"]
        after = self._cpu()
        wal = await _wal_bytes(conn) - wal_before
        after["producer"] = out["cpu_seconds"]
        cpu = self._per_job_us(before, after, len(sent))
        self.result["latency"] = {
            "offered": len(sent),
            "sent": sent,
            "cpu_us_per_job": cpu,
            "noise_cores": self._noise_cores(before, after),
            "wal_bytes": wal,
            "counters": await self._counters_delta(counters),
            "profiles": self._profiles(),
            "statements": await self.cluster.top_statements(conn),
        }
        self.result["peak_rss_mib"]["producer (offer)"] = out["maxrss_kib"] / KIB_PER_MIB

    async def _deferred(self, conn: asyncpg.Connection, dsn: str) -> None:
        """The deferred parts, per job the run finished (the drained ones and the latency
        run's), with nothing of the system running: what it still does after the jobs are
        finished (Evora's projector catching up) is waited for, then it is stopped."""
        await self.system.after_drain()
        await self.system.settle(conn)
        self.system.stop()
        await wholelife.wait_alone(conn)
        jobs = self.workload.jobs + self.result["latency"]["offered"]
        autovacuum_runs = await wholelife.autovacuum_runs(conn, self.system.schemas)
        parts = []
        async with AsyncExitStack() as stack:
            for part in await self.system.deferred_parts(conn, dsn, stack):
                if part.later:
                    await conn.execute("CHECKPOINT")
                before = {POSTGRES: self.cluster.cpu(), "client": procstats.own_cpu_seconds()}
                before |= {MACHINE: procstats.machine_busy_seconds(), WALL: time.monotonic()}
                wal_before = await _wal_bytes(conn)
                did = await part.run()
                wal = await _wal_bytes(conn) - wal_before
                after = {POSTGRES: self.cluster.cpu(), "client": procstats.own_cpu_seconds()}
                after |= {MACHINE: procstats.machine_busy_seconds(), WALL: time.monotonic()}
                await wholelife.flush_stats(conn)
                parts.append(
                    {
                        "part": part.name,
                        "checkpoint_first": part.later,
                        "seconds": after[WALL] - before[WALL],
                        "wal_bytes": wal,
                        "wal_bytes_per_job": wal / jobs,
                        "cpu_us_per_job": self._per_job_us(before, after, jobs),
                        "noise_cores": self._noise_cores(before, after),
                        "did": did,
                    }
                )
        self.result["deferred"] = {
            "jobs": jobs,
            "parts": parts,
            # autovacuum and autoanalyze runs on the system's tables from the first phase to
            # the deferred parts (autovacuum being off for them: 0 expected)
            "autovacuum_runs": autovacuum_runs - self._autovacuum_runs,
        }

    def _stop_and_collect(self, sampler: PeakSampler) -> list[list[float]]:
        """Peak memory of every process; stops the worker and returns its handler starts."""
        assert self.worker is not None
        rss = self.result.setdefault("peak_rss_mib", {})
        for child in self.system.services:
            rss[self._short(child)] = child.peak_rss_kib() / KIB_PER_MIB
        self.worker.stop()
        worker = json.loads(self._out("worker").read_text())
        rss["worker"] = worker["maxrss_kib"] / KIB_PER_MIB
        rss[POSTGRES + " (private, all processes)"] = sampler.peak_kib / KIB_PER_MIB
        starts: list[list[float]] = worker["starts"]
        return starts

    @staticmethod
    def _first_starts(starts: list[list[float]]) -> tuple[dict[int, float], int]:
        """Each job's first handler start by its payload `i`, and how many starts repeated
        one (a job run twice)."""
        first: dict[int, float] = {}
        duplicates = 0
        for i, t in starts:
            if int(i) in first:
                duplicates += 1
            else:
                first[int(i)] = t
        return first, duplicates

    def _score(self, starts: list[list[float]]) -> None:
        """Drain and latency figures from the handler starts the worker recorded."""
        first, duplicates = self._first_starts(starts)
        drained = [t for i, t in first.items() if i < LATENCY_FIRST_INDEX]
        drain = self.result["drain"]
        drain["handled"] = len(drained)
        drain["duplicates"] = duplicates
        drain["seconds"] = drain["finished_at"] - min(drained)
        drain["jobs_per_s"] = drain["jobs"] / drain["seconds"]
        latency = self.result["latency"]
        sent = latency.pop("sent")
        from_return = [first[int(i)] - t_ret for i, _, t_ret in sent if int(i) in first]
        from_call = [first[int(i)] - t_call for i, t_call, _ in sent if int(i) in first]
        calls = [t_ret - t_call for _, t_call, t_ret in sent]
        latency["handled"] = len(from_return)
        latency["ms_from_return"] = distribution(from_return)
        latency["ms_from_call"] = distribution(from_call)
        latency["ms_enqueue_call"] = distribution(calls)
        span = max(t for _, t, _ in sent) - min(t for _, t, _ in sent) if sent else 0.0
        latency["achieved_rate"] = (len(sent) - 1) / span if span > 0 else 0.0
