"""Targets under pressure (`python -m bench compare --pressure`) and a soak as deployed
(`python -m bench compare --soak MINUTES`).

**Pressure.** Per system, on a fresh database of the shared cluster, with its worker
running: a producer offers `rate` jobs/s, open loop (the latency workload's producer), for
three periods in a row:

- `clean`: `clean_s` seconds;
- `pinned`: `pinned_s` seconds while another session holds `BEGIN; SELECT txid_current();`
  open (an xid taken and kept: the cluster's xmin horizon stays at it), in another database
  of the same cluster (`pin_in` "other") or in the system's own database ("same");
- `released`: `after_s` seconds after that session rolled back.

Every `sample_s` seconds it records, in the system's database, every user table's total
size and `n_dead_tup` (partitions counted with their root); for Evora also the read model's
completed count (`GET /v1/queues/bench/stats`, `totals.completed`, from MongoDB) and
PostgreSQL's (`count(*)` of COMPLETED jobs). Per period it reports, from the handler
starts the worker recorded and the producer's calls:

- offered and completed (handler starts) per second, and the pinned/clean ratio;
- wake latency p50/p99 (handler start - call returned) of the jobs offered in the period;
- the largest backlog (jobs offered and not started yet) seen at a sample;
- each table's largest size and dead tuples, and the largest sum of dead tuples;
- Evora's read-model lag, a per-sample estimate: at sample k the read model showed
  completed = R; the lag is t_k - the moment PostgreSQL's count reached R (how old the
  truth it shows is): the latest sample j <= k whose count was <= R, interpolated linearly
  towards sample j + 1; 0 if it shows the truth. The largest lag of the period is reported.

**Soak.** Evora as deployed (four services, SDK worker) at `rate` jobs/s for `minutes`, with
short retention (finished jobs and events kept `retention_s`, partitions of 60 s) so that
table sizes reach their bound within the run. Sampled every `sample_s` s; reported per
minute: completed/s, wake p99, every process's RSS (VmRSS; PostgreSQL's as its private
memory summed over its processes), each table's size and dead tuples. Verdict per figure,
over the minutes after `warmup_minutes` (retention's windows filling): **flat** when the
mean of the last third of those minutes is at most the first third's mean x (1 + FLAT
tolerance) + a floor (`FLAT`): RSS 10 % + 1 MiB, table size 20 % + 1 MiB, dead tuples 50 %
+ 1,000, wake p99 50 % + 1 ms. A decrease is flat. The bench's own recording costs the
worker 16 bytes a job and the producer 24 (`bench.runnerkit`): at 100 jobs/s, 1.7 MiB and
2.6 MiB over 30 minutes.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from bench import procstats
from bench.children import Child, Children
from bench.cluster import Cluster
from bench.evora_system import EvoraSystem
from bench.stats import distribution
from bench.system import System
from bench.workloads import KIB_PER_MIB

PERIODS = ("clean", "pinned", "released")
MINUTE_S = 60.0  # the timeline's step: the same figures per minute
PIN_DATABASE = "bench_pin"
PIN_PLACES = ("other", "same")
FINISH_TIMEOUT_S = 600.0
# Per table of the system's database (any schema): partitions counted with their root.
TABLES = """
SELECT coalesce(pg_partition_root(s.relid), s.relid)::regclass::text AS name,
       sum(pg_total_relation_size(s.relid))::int8 AS bytes,
       sum(s.n_dead_tup)::int8 AS dead
FROM pg_stat_user_tables s
GROUP BY 1 ORDER BY 1
"""
EVORA_COMPLETED = "SELECT count(*) FROM evora.jobs WHERE queue = 'bench' AND state = 'COMPLETED'"
# The soak's retention: short windows so that sizes reach their bound within minutes.
SOAK_RETENTION_S = 120
SOAK_PARTITION_S = 60


@dataclass(frozen=True)
class Pressure:
    rate: float = 200.0
    clean_s: float = 120.0
    pinned_s: float = 600.0
    after_s: float = 60.0
    pin_in: tuple[str, ...] = ("other",)
    sample_s: float = 1.0

    @classmethod
    def quick(cls) -> Pressure:
        return cls(rate=100.0, clean_s=20.0, pinned_s=20.0, after_s=10.0)


@dataclass(frozen=True)
class Soak:
    minutes: float = 30.0
    rate: float = 100.0
    warmup_minutes: float = 5.0
    sample_s: float = 5.0
    bucket_s: float = 60.0
    retention_s: int = SOAK_RETENTION_S


@dataclass(frozen=True)
class Flat:
    """Flat: last-third mean <= first-third mean x (1 + `tolerance`) + `floor`."""

    tolerance: float
    floor: float


FLAT = {
    "rss_mib": Flat(0.10, 1.0),
    "size_mib": Flat(0.20, 1.0),
    "dead": Flat(0.50, 1000.0),
    "p99_ms": Flat(0.50, 1.0),
}


@dataclass
class Sampler:
    """Samples the system's tables (and Evora's read model, and every process's RSS) every
    `every` seconds until stopped."""

    conn: asyncpg.Connection
    system: System
    cluster: Cluster
    every: float
    processes: Callable[[], dict[str, int]]
    samples: list[dict[str, Any]] = field(default_factory=list)

    async def _read_model(self, session: aiohttp.ClientSession) -> int | None:
        assert isinstance(self.system, EvoraSystem)
        url = self.system.urls["api"] + "/v1/queues/bench/stats"
        headers = {"Authorization": f"Bearer {self.system.tokens['admin']}"}
        async with session.get(url, headers=headers) as resp:
            if resp.status == 404:  # no event of the queue projected yet
                return 0
            if resp.status != 200:
                return None
            completed: int = (await resp.json())["totals"]["completed"]
            return completed

    async def _one(self, session: aiohttp.ClientSession | None) -> dict[str, Any]:
        sample: dict[str, Any] = {"t": time.time()}
        if session is not None:
            # The read model first, then the truth: the truth is never older than it.
            sample["read_model"] = await self._read_model(session)
            sample["truth"] = await self.conn.fetchval(EVORA_COMPLETED)
        rows = await self.conn.fetch(TABLES)
        sample["tables"] = {r["name"]: [r["bytes"], r["dead"]] for r in rows}
        rss = {
            name: procstats.status_kib(pid, "VmRSS") or 0 for name, pid in self.processes().items()
        }
        rss["postgresql (private)"] = self.cluster.anon_kib()
        sample["rss_mib"] = {name: kib / KIB_PER_MIB for name, kib in rss.items()}
        return sample

    async def run(self, stop: asyncio.Event) -> None:
        evora = isinstance(self.system, EvoraSystem)
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                self.samples.append(await self._one(session if evora else None))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.every)
            # Once more when stopped: the end state (every job finished) is sampled too.
            self.samples.append(await self._one(session if evora else None))


def _processes(system: System, worker: Child, producer: Child, cluster: Cluster) -> dict[str, int]:
    found = {child.name.rsplit("-", 1)[-1]: child.pid for child in system.services}
    found["worker"] = worker.pid
    found["producer (bench)"] = producer.pid
    if isinstance(system, EvoraSystem) and cluster.mongo_pid is not None:
        found["mongo-wire stand-in"] = cluster.mongo_pid
    return {name: pid for name, pid in found.items() if procstats.cpu_seconds(pid) is not None}


async def _pin(dsn: str) -> asyncpg.Connection:
    """A session that takes an xid and stays idle in its transaction: the cluster's xmin
    horizon stays at it until it ends."""
    conn = await asyncpg.connect(dsn)
    await conn.execute("BEGIN")
    await conn.fetchval("SELECT txid_current()")
    return conn


async def _release(conn: asyncpg.Connection) -> None:
    await conn.execute("ROLLBACK")
    await conn.close()


async def _wait_finished(conn: asyncpg.Connection, system: System) -> None:
    deadline = time.monotonic() + FINISH_TIMEOUT_S
    while await conn.fetchval(system.unfinished_sql):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{system.name}: jobs unfinished {FINISH_TIMEOUT_S:.0f} s after")
        await asyncio.sleep(0.2)


@dataclass
class Load:
    """One open-loop run of a system with its worker, sampled; `during` runs beside it."""

    system: System
    cluster: Cluster
    label: str
    rate: float
    seconds: float
    sample_s: float

    def _out(self, name: str) -> Path:
        return self.system.children.directory / f"{self.system.name}-{self.label}-{name}.json"

    async def run(
        self, dsn: str, during: Callable[[], Any] | None = None
    ) -> tuple[list[list[float]], list[list[float]], list[dict[str, Any]], Any]:
        """(sent, starts, samples, what `during` returned)."""
        await self.system.start(dsn, self.label)
        conn = await asyncpg.connect(dsn)
        worker: Child | None = None
        try:
            worker = self.system.spawn_runner(
                f"{self.label}-worker", ["work", "--out", str(self._out("worker"))]
            )
            await worker.wait_ready_line()
            producer = self.system.spawn_runner(
                f"{self.label}-offer",
                [
                    "offer",
                    *("--rate", str(self.rate), "--seconds", str(self.seconds)),
                    *("--out", str(self._out("offer"))),
                ],
            )
            sampler_conn = await asyncpg.connect(dsn)
            running = worker
            sampler = Sampler(
                sampler_conn,
                self.system,
                self.cluster,
                self.sample_s,
                lambda: _processes(self.system, running, producer, self.cluster),
            )
            stop = asyncio.Event()
            sampling = asyncio.create_task(sampler.run(stop))
            try:
                extra = await during() if during is not None else None
                await producer.wait_exit(self.seconds + FINISH_TIMEOUT_S)
                await _wait_finished(conn, self.system)
            finally:
                stop.set()
                await sampling
                await sampler_conn.close()
            worker.stop()
            sent: list[list[float]] = json.loads(self._out("offer").read_text())["sent"]
            starts: list[list[float]] = json.loads(self._out("worker").read_text())["starts"]
            return sent, starts, sampler.samples, extra
        finally:
            await conn.close()
            if worker is not None:
                worker.stop()
            self.system.stop()


def _first_starts(starts: list[list[float]]) -> dict[int, float]:
    first: dict[int, float] = {}
    for i, t in starts:
        first.setdefault(int(i), t)
    return first


def read_model_lags(samples: list[dict[str, Any]]) -> list[float | None]:
    """Per sample, how old the truth the read model showed was (see the module's doc): the
    moment PostgreSQL's count reached what the read model shows, interpolated linearly
    between the two samples around it."""
    lags: list[float | None] = []
    for k, s in enumerate(samples):
        shown = s.get("read_model")
        if shown is None:
            lags.append(None)
            continue
        lag = s["t"] - samples[0]["t"]  # older than every sample: a lower bound
        for j in range(k, -1, -1):
            if samples[j]["truth"] <= shown:
                reached = samples[j]["t"]
                if j < k:
                    after = samples[j + 1]
                    share = (shown - samples[j]["truth"]) / (after["truth"] - samples[j]["truth"])
                    reached += share * (after["t"] - samples[j]["t"])
                lag = s["t"] - reached
                break
        lags.append(lag)
    return lags


def score_period(
    start: float,
    end: float,
    sent: list[list[float]],
    first: dict[int, float],
    samples: list[dict[str, Any]],
    lags: list[float | None],
) -> dict[str, Any]:
    seconds = max(end - start, 1e-9)
    offered = [(int(i), t_call, t_ret) for i, t_call, t_ret in sent if start <= t_call < end]
    started = sorted(first.values())
    completed = bisect.bisect_left(started, end) - bisect.bisect_left(started, start)
    returned = sorted(t_ret for _, _, t_ret in sent)
    inside = [(k, s) for k, s in enumerate(samples) if start <= s["t"] < end]
    backlog = [
        bisect.bisect_right(returned, s["t"]) - bisect.bisect_right(started, s["t"])
        for _, s in inside
    ]
    tables: dict[str, dict[str, float]] = {}
    for _, s in inside:
        for name, (size, dead) in s["tables"].items():
            t = tables.setdefault(name, {"max_mib": 0.0, "max_dead": 0})
            t["max_mib"] = max(t["max_mib"], size / 2**20)
            t["max_dead"] = max(t["max_dead"], dead)
    result: dict[str, Any] = {
        "seconds": seconds,
        "offered_per_s": len(offered) / seconds,
        "completed_per_s": completed / seconds,
        "wake_ms": distribution([first[i] - t_ret for i, _, t_ret in offered if i in first]),
        "not_started": sum(1 for i, _, _ in offered if i not in first),
        "max_backlog": max(backlog, default=0),
        "tables": tables,
        "max_dead_all_tables": max(
            (sum(d for _, d in s["tables"].values()) for _, s in inside), default=0
        ),
    }
    period_lags = [lag for k, _ in inside if (lag := lags[k]) is not None]
    if period_lags:
        result["read_model_max_lag_s"] = max(period_lags)
    return result


def score_pressure(
    sent: list[list[float]],
    starts: list[list[float]],
    samples: list[dict[str, Any]],
    pinned_at: float,
    released_at: float,
) -> dict[str, Any]:
    first = _first_starts(starts)
    calls = [t_call for _, t_call, _ in sent]
    bounds = {
        "clean": (min(calls), pinned_at),
        "pinned": (pinned_at, released_at),
        "released": (released_at, max(calls) + 1e-6),
    }
    lags = read_model_lags(samples)
    start, end = bounds["clean"][0], bounds["released"][1]
    minutes = [
        score_period(a, min(a + MINUTE_S, end), sent, first, samples, lags)
        for a in (start + k * MINUTE_S for k in range(math.ceil((end - start) / MINUTE_S)))
    ]
    periods = {
        name: score_period(a, b, sent, first, samples, lags) for name, (a, b) in bounds.items()
    }
    clean, pinned = periods["clean"], periods["pinned"]
    return {
        "periods": periods,
        "minutes": minutes,
        "pinned_over_clean": pinned["completed_per_s"] / clean["completed_per_s"]
        if clean["completed_per_s"]
        else math.nan,
        "offered": len(sent),
        "handled": len(first),
        "duplicates": len(starts) - len(first),
    }


async def pressure_run(
    system: System, cluster: Cluster, dsn: str, p: Pressure, label: str, pin_in: str
) -> dict[str, Any]:
    pin_dsn = cluster.dsn(PIN_DATABASE) if pin_in == "other" else dsn
    moments: dict[str, float] = {}

    # With `--profile`, pg_stat_statements of the system's database per period.
    statements: dict[str, list[str]] = {}

    async def pin_then_release() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await cluster.reset_statements(conn)
            await asyncio.sleep(p.clean_s)
            statements["clean"] = await cluster.top_statements(conn)
            await cluster.reset_statements(conn)
            pin = await _pin(pin_dsn)
            moments["pinned_at"] = time.time()
            print(f"   pinned ({pin_in} database)", flush=True)
            try:
                await asyncio.sleep(p.pinned_s)
            finally:
                await _release(pin)
            moments["released_at"] = time.time()
            print("   released", flush=True)
            statements["pinned"] = await cluster.top_statements(conn)
            await cluster.reset_statements(conn)
            await asyncio.sleep(p.after_s)
            statements["released"] = await cluster.top_statements(conn)
        finally:
            await conn.close()

    load = Load(system, cluster, label, p.rate, p.clean_s + p.pinned_s + p.after_s, p.sample_s)
    sent, starts, samples, _ = await load.run(dsn, pin_then_release)
    result = score_pressure(sent, starts, samples, moments["pinned_at"], moments["released_at"])
    result.update(
        {
            "system": system.name,
            "pin_in": pin_in,
            "label": label,
            "samples": samples,
            "statements": statements,
            **moments,
        }
    )
    return result


async def compare_pressure(
    cluster: Cluster,
    directory: Path,
    systems: list[str],
    p: Pressure,
    make: Callable[[str, Children], System],
) -> list[dict[str, Any]]:
    """Every system under every pin place, interleaved (evora, graphile, ..., then the
    next place)."""
    children = Children(directory)
    await cluster.execute(f'DROP DATABASE IF EXISTS "{PIN_DATABASE}"')
    await cluster.execute(f'CREATE DATABASE "{PIN_DATABASE}"')
    runs = []
    try:
        for pin_in in p.pin_in:
            for name in systems:
                system = make(name, children)
                label = f"pressure-{pin_in}"
                database = f"bench_{name.replace('@', '_')}_{label.replace('-', '_')}"
                print(f"== {name}, pinned in the {pin_in} database", flush=True)
                dsn = await cluster.fresh_database(database)
                result = await pressure_run(system, cluster, dsn, p, label, pin_in)
                print("\n".join(pressure_lines(result)), flush=True)
                runs.append(result)
                await cluster.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
    finally:
        children.stop_all()
    return runs


def _fmt(value: float, digits: int = 1) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:,.{digits}f}"


def pressure_lines(run: dict[str, Any]) -> list[str]:
    periods = run["periods"]
    lines = [
        f"{run['system']} (pinned in the {run['pin_in']} database): completed pinned / clean"
        f" {_fmt(run['pinned_over_clean'], 3)}; {run['handled']} of {run['offered']} offered"
        f" jobs ran, {run['duplicates']} twice",
        "  period   |     s | offered/s | completed/s | wake p50 / p99 ms | max backlog |"
        " max dead, all tables | read-model max lag s",
    ]
    for name in PERIODS:
        q = periods[name]
        lines.append(
            f"  {name:8} | {q['seconds']:5.0f} | {q['offered_per_s']:9.1f} |"
            f" {q['completed_per_s']:11.1f} | {_fmt(q['wake_ms']['p50'], 2):>7} /"
            f" {_fmt(q['wake_ms']['p99'], 2):>7} | {q['max_backlog']:11} |"
            f" {q['max_dead_all_tables']:20} | {_fmt(q.get('read_model_max_lag_s', math.nan))}"
        )
    lines.append("  per minute | completed/s | wake p50 / p99 ms | max backlog | max dead | lag s")
    for k, q in enumerate(run.get("minutes", [])):
        lines.append(
            f"  {k + 1:10} | {q['completed_per_s']:11.1f} | {_fmt(q['wake_ms']['p50'], 2):>7} /"
            f" {_fmt(q['wake_ms']['p99'], 2):>7} | {q['max_backlog']:11} |"
            f" {q['max_dead_all_tables']:8} | {_fmt(q.get('read_model_max_lag_s', math.nan))}"
        )
    names = sorted({t for q in periods.values() for t in q["tables"]})
    lines.append("  tables: max MiB / max dead tuples, clean -> pinned -> released")
    for t in names:
        cells = [periods[n]["tables"].get(t, {"max_mib": 0.0, "max_dead": 0}) for n in PERIODS]
        if max(c["max_mib"] for c in cells) < 0.1 and max(c["max_dead"] for c in cells) == 0:
            continue  # untouched tables of the schema
        lines.append(
            f"    {t}: " + " -> ".join(f"{c['max_mib']:.1f} / {c['max_dead']}" for c in cells)
        )
    for period, top in run.get("statements", {}).items():
        if top:
            lines += [f"  statements, {period}:", *(f"    {line}" for line in top[:5])]
    return lines


# -- the soak ---------------------------------------------------------------------------------


def soak_settings(s: Soak) -> dict[str, str]:
    window = str(s.retention_s)
    return {
        "EVORA_RETENTION_COMPLETED_SECONDS": window,
        "EVORA_RETENTION_CANCELLED_SECONDS": window,
        "EVORA_RETENTION_EVENTS_SECONDS": window,
        "EVORA_EVENT_PARTITION_SECONDS": str(SOAK_PARTITION_S),
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def score_soak(
    s: Soak, sent: list[list[float]], starts: list[list[float]], samples: list[dict[str, Any]]
) -> dict[str, Any]:
    first = _first_starts(starts)
    t0 = min(t_call for _, t_call, _ in sent)
    count = max(1, math.ceil((max(t_call for _, t_call, _ in sent) - t0) / s.bucket_s))
    minutes: list[dict[str, Any]] = []
    started = sorted(first.values())
    for b in range(count):
        a, z = t0 + b * s.bucket_s, t0 + (b + 1) * s.bucket_s
        inside = [x for x in samples if a <= x["t"] < z]
        waits = [
            first[int(i)] - t_ret
            for i, t_call, t_ret in sent
            if a <= t_call < z and int(i) in first
        ]
        rss: dict[str, float] = {}
        for name in {n for x in inside for n in x["rss_mib"]}:
            rss[name] = _mean([x["rss_mib"][name] for x in inside if name in x["rss_mib"]])
        tables: dict[str, list[float]] = {}
        for x in inside:
            for name, (size, dead) in x["tables"].items():
                cell = tables.setdefault(name, [0.0, 0])
                cell[0], cell[1] = max(cell[0], size / 2**20), max(cell[1], dead)
        done = bisect.bisect_left(started, z) - bisect.bisect_left(started, a)
        minutes.append(
            {
                "minute": b + 1,
                "completed_per_s": done / s.bucket_s,
                "p99_ms": distribution(waits)["p99"],
                "rss_mib": rss,
                "tables": tables,
            }
        )
    return {"minutes": minutes, "verdicts": soak_verdicts(s, minutes)}


def _flat(kind: str, series: list[float]) -> dict[str, Any]:
    third = max(1, len(series) // 3)
    head, tail = _mean(series[:third]), _mean(series[-third:])
    rule = FLAT[kind]
    return {
        "first_third": head,
        "last_third": tail,
        "change": (tail - head) / head if head else math.nan,
        "flat": tail <= head * (1 + rule.tolerance) + rule.floor,
    }


def soak_verdicts(s: Soak, minutes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    steady = [m for m in minutes if m["minute"] > s.warmup_minutes] or minutes
    verdicts: dict[str, dict[str, Any]] = {}
    for name in sorted({n for m in steady for n in m["rss_mib"]}):
        if name.endswith("(bench)"):
            continue
        verdicts[f"RSS {name}"] = _flat("rss_mib", [m["rss_mib"].get(name, 0.0) for m in steady])
    for name in sorted({n for m in steady for n in m["tables"]}):
        sizes = [m["tables"].get(name, [0.0, 0])[0] for m in steady]
        deads = [float(m["tables"].get(name, [0.0, 0])[1]) for m in steady]
        if max(sizes) >= 1.0:
            verdicts[f"size {name}"] = _flat("size_mib", sizes)
        if max(deads) >= 1000:
            verdicts[f"dead tuples {name}"] = {**_flat("dead", deads), "max": max(deads)}
    verdicts["wake p99"] = _flat("p99_ms", [m["p99_ms"] for m in steady])
    return verdicts


async def soak(cluster: Cluster, directory: Path, s: Soak) -> dict[str, Any]:
    children = Children(directory)
    system = EvoraSystem(children, cluster.mongo_url, settings=soak_settings(s))
    try:
        dsn = await cluster.fresh_database("bench_evora_soak")
        load = Load(system, cluster, "soak", s.rate, s.minutes * 60, s.sample_s)
        sent, starts, samples, _ = await load.run(dsn)
    finally:
        children.stop_all()
    result = score_soak(s, sent, starts, samples)
    result.update(
        {
            "offered": len(sent),
            "handled": len(_first_starts(starts)),
            "duplicates": len(starts) - len(_first_starts(starts)),
            "samples": samples,
        }
    )
    return result


def soak_lines(s: Soak, result: dict[str, Any]) -> list[str]:
    minutes = result["minutes"]
    processes = sorted({n for m in minutes for n in m["rss_mib"]})
    tables = sorted(
        {
            n
            for m in minutes
            for n, (size, dead) in m["tables"].items()
            if size >= 1.0 or dead >= 1000
        }
    )
    lines = [
        f"soak: {result['offered']} jobs offered at {s.rate:g}/s for {s.minutes:g} min,"
        f" {result['handled']} ran, {result['duplicates']} twice",
        "| min | done/s | p99 ms | "
        + " | ".join(f"{p} MiB" for p in processes)
        + " | "
        + " | ".join(f"{t} MiB / dead" for t in tables)
        + " |",
        "|" + " ---: |" * (3 + len(processes) + len(tables)),
    ]
    for m in minutes:
        cells = [f"{m['rss_mib'].get(p, math.nan):.1f}" for p in processes]
        cells += [
            f"{m['tables'].get(t, [0.0, 0])[0]:.1f} / {m['tables'].get(t, [0.0, 0])[1]}"
            for t in tables
        ]
        lines.append(
            f"| {m['minute']} | {m['completed_per_s']:.1f} | {_fmt(m['p99_ms'], 2)} | "
            + " | ".join(cells)
            + " |"
        )
    lines.append(
        f"\nverdicts over minutes > {s.warmup_minutes:g} (flat: last-third mean <= first-third"
        " mean x (1 + tolerance) + floor; RSS 10 % + 1 MiB, size 20 % + 1 MiB, dead 50 %"
        " + 1,000, p99 50 % + 1 ms):"
    )
    for name, v in result["verdicts"].items():
        extra = f", max {v['max']:.0f}" if "max" in v else ""
        lines.append(
            f"  {name}: {'flat' if v['flat'] else 'GROWS'} ({_fmt(v['first_third'], 2)} ->"
            f" {_fmt(v['last_third'], 2)}, {_fmt(100 * v['change'], 1)} %{extra})"
        )
    return lines
