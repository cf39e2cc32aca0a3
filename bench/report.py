"""Figures of all repetitions: median [min-max] per system, each as a ratio to the best peer,
printed and written as JSON."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.stats import median
from bench.workloads import MONGO, POSTGRES

SUBJECT = "evora"
PHASES = ("enqueue", "drain", "latency")
NAN = float("nan")


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    unit: str
    higher_is_better: bool
    read: Callable[[dict[str, Any]], float]


def _cpu_total(phase: str) -> Callable[[dict[str, Any]], float]:
    # The MongoDB-wire stand-in is not Evora (a real MongoDB would cost something else):
    # shown per process, left out of the totals.
    def total(run: dict[str, Any]) -> float:
        return sum(float(v) for k, v in run[phase]["cpu_us_per_job"].items() if k != MONGO)

    return total


def _wal_drain(r: dict[str, Any]) -> float:
    wal = int(r["enqueue"]["wal_bytes"]) + int(r["drain"]["wal_bytes"])
    return wal / int(r["drain"]["jobs"])


def _deferred(key: str) -> Callable[[dict[str, Any]], float]:
    """Per job, summed over the deferred parts (`--whole-life`): WAL ("wal") or the CPU of
    one process (POSTGRES) or of all ("cpu")."""

    def total(run: dict[str, Any]) -> float:
        parts = run["deferred"]["parts"]
        if key == "wal":
            return sum(float(p["wal_bytes_per_job"]) for p in parts)
        if key == "cpu":
            return sum(float(v) for p in parts for v in p["cpu_us_per_job"].values())
        return sum(float(p["cpu_us_per_job"][key]) for p in parts)

    return total


def _postgres(phase: str) -> Callable[[dict[str, Any]], float]:
    return lambda r: float(r[phase]["cpu_us_per_job"][POSTGRES])


def _rss_total(r: dict[str, Any]) -> float:
    return sum(float(v) for k, v in r["peak_rss_mib"].items() if not k.startswith("producer"))


FIGURES = (
    Figure(
        "enqueue",
        "enqueue (batches of 1,000)",
        "jobs/s",
        True,
        lambda r: r["enqueue"]["jobs_per_s"],
    ),
    Figure("drain", "drain", "jobs/s", True, lambda r: r["drain"]["jobs_per_s"]),
    Figure(
        "p50",
        "latency p50 (return -> start)",
        "ms",
        False,
        lambda r: r["latency"]["ms_from_return"]["p50"],
    ),
    Figure("p95", "latency p95", "ms", False, lambda r: r["latency"]["ms_from_return"]["p95"]),
    Figure("p99", "latency p99", "ms", False, lambda r: r["latency"]["ms_from_return"]["p99"]),
    Figure(
        "call_p50",
        "latency p50 from the call's start",
        "ms",
        False,
        lambda r: r["latency"]["ms_from_call"]["p50"],
    ),
    Figure(
        "cpu_enqueue", "CPU per job, enqueue (all processes)", "us", False, _cpu_total("enqueue")
    ),
    Figure("cpu_drain", "CPU per job, drain (all processes)", "us", False, _cpu_total("drain")),
    Figure(
        "cpu_latency",
        "CPU per job, latency run (all processes)",
        "us",
        False,
        _cpu_total("latency"),
    ),
    Figure(
        "wal_drain",
        "WAL bytes per job, enqueue + drain",
        "B",
        False,
        _wal_drain,
    ),
    Figure("rss", "peak RSS, sum of worker, services, PostgreSQL", "MiB", False, _rss_total),
    Figure("pg_drain", "PostgreSQL CPU per job, drain", "us", False, _postgres("drain")),
    # --whole-life: what the finished jobs still cost after the drain (bench.wholelife)
    Figure("wal_deferred", "WAL bytes per job, deferred", "B", False, _deferred("wal")),
    Figure(
        "wal_whole",
        "WAL bytes per job, enqueue + drain + deferred",
        "B",
        False,
        lambda r: _wal_drain(r) + _deferred("wal")(r),
    ),
    Figure("pg_deferred", "PostgreSQL CPU per job, deferred", "us", False, _deferred(POSTGRES)),
    Figure(
        "pg_drain_deferred",
        "PostgreSQL CPU per job, drain + deferred",
        "us",
        False,
        lambda r: _postgres("drain")(r) + _deferred(POSTGRES)(r),
    ),
    Figure(
        "pg_whole",
        "PostgreSQL CPU per job, enqueue + drain + deferred",
        "us",
        False,
        lambda r: _postgres("enqueue")(r) + _postgres("drain")(r) + _deferred(POSTGRES)(r),
    ),
    Figure(
        "cpu_whole",
        "CPU per job, enqueue + drain + deferred (all processes)",
        "us",
        False,
        lambda r: _cpu_total("enqueue")(r) + _cpu_total("drain")(r) + _deferred("cpu")(r),
    ),
)


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": median(values), "min": min(values), "max": max(values)}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    systems = list(dict.fromkeys(r["system"] for r in runs))
    summary: dict[str, Any] = {}
    for figure in FIGURES:
        try:
            per_system = {
                s: _spread([figure.read(r) for r in runs if r["system"] == s]) for s in systems
            }
        except KeyError:  # a result file from before this figure was measured
            continue
        # Peers are the other queues: Evora's variants and configurations are not.
        peers = {s: v["median"] for s, v in per_system.items() if not s.startswith(SUBJECT)}
        entry: dict[str, Any] = {
            "label": figure.label,
            "unit": figure.unit,
            "higher_is_better": figure.higher_is_better,
            "systems": per_system,
        }
        if peers and SUBJECT in per_system:
            pick = max if figure.higher_is_better else min
            best = pick(peers, key=lambda s: peers[s])
            entry["best_peer"] = best
            entry["ratios_to_best_peer"] = {
                s: v["median"] / peers[best] if peers[best] else None for s, v in per_system.items()
            }
        summary[figure.key] = entry
    summary["per_process"] = _per_process(runs, systems)
    if all("deferred" in r for r in runs):
        summary["deferred_parts"] = _deferred_parts(runs, systems)
    summary["noise_cores"] = {
        s: {p: median([r[p]["noise_cores"] for r in runs if r["system"] == s]) for p in PHASES}
        for s in systems
    }
    return summary


def _per_process(runs: list[dict[str, Any]], systems: list[str]) -> dict[str, Any]:
    """Medians per system and process: CPU us/job of each phase and peak RSS."""
    table: dict[str, Any] = {}
    for system in systems:
        mine = [r for r in runs if r["system"] == system]
        columns: dict[str, dict[str, list[float]]] = {}
        for run in mine:
            for phase in PHASES:
                for proc, us in run[phase]["cpu_us_per_job"].items():
                    columns.setdefault(proc, {}).setdefault(f"cpu_us_{phase}", []).append(us)
            for proc, mib in run["peak_rss_mib"].items():
                columns.setdefault(proc, {}).setdefault("peak_rss_mib", []).append(mib)
        table[system] = {
            proc: {column: median(values) for column, values in row.items()}
            for proc, row in columns.items()
        }
    return table


def _deferred_parts(runs: list[dict[str, Any]], systems: list[str]) -> dict[str, Any]:
    """Medians per system and deferred part: WAL and CPU per job, seconds, what it did."""
    table: dict[str, Any] = {}
    for system in systems:
        mine = [r["deferred"] for r in runs if r["system"] == system]
        rows: dict[str, dict[str, list[float]]] = {}
        for deferred in mine:
            for part in deferred["parts"]:
                row = rows.setdefault(part["part"], {})
                cells = {"wal_bytes_per_job": part["wal_bytes_per_job"], "seconds": part["seconds"]}
                cells |= {f"cpu_us_{k}": v for k, v in part["cpu_us_per_job"].items()}
                cells |= {f"did_{k}": v for k, v in part["did"].items()}
                for key, value in cells.items():
                    row.setdefault(key, []).append(float(value))
        table[system] = {
            "jobs": median([float(d["jobs"]) for d in mine]),
            "autovacuum_runs": max(d["autovacuum_runs"] for d in mine),
            "parts": {
                name: {key: median(values) for key, values in row.items()}
                for name, row in rows.items()
            },
        }
    return table


def _num(value: float) -> str:
    if value != value:  # NaN
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"


def lines(summary: dict[str, Any]) -> list[str]:
    out = []
    for figure in FIGURES:
        if figure.key not in summary:
            continue
        entry = summary[figure.key]
        out.append(
            f"{entry['label']} ({entry['unit']}, "
            f"{'higher' if entry['higher_is_better'] else 'lower'} is better):"
        )
        ratios = entry.get("ratios_to_best_peer", {})
        for system, v in entry["systems"].items():
            ratio = ratios.get(system)
            shown = "" if ratio is None else f"  = {ratio:.2f} x best peer ({entry['best_peer']})"
            out.append(
                f"  {system:10} {_num(v['median']):>10} [{_num(v['min'])}-{_num(v['max'])}]{shown}"
            )
    out.append("per process (medians): CPU us/job enqueue / drain / latency run, peak RSS MiB")
    for system, rows in summary["per_process"].items():
        for proc, row in rows.items():
            cells = [*(row.get(f"cpu_us_{phase}", NAN) for phase in PHASES)]
            cells.append(row.get("peak_rss_mib", NAN))
            out.append(f"  {system:10} {proc:38} " + " ".join(f"{_num(c):>8}" for c in cells))
    if "deferred_parts" in summary:
        out.append(
            "deferred work per job (medians): WAL B, PostgreSQL CPU us, client CPU us, wall s;"
            " what it did"
        )
        for system, entry in summary["deferred_parts"].items():
            out.append(
                f"  {system:10} per {entry['jobs']:,.0f} jobs finished; autovacuum runs"
                f" meanwhile: {entry['autovacuum_runs']}"
            )
            for name, row in entry["parts"].items():
                cells = [row["wal_bytes_per_job"], row[f"cpu_us_{POSTGRES}"], row["cpu_us_client"]]
                did = ", ".join(f"{k[4:]} {v:,.0f}" for k, v in row.items() if k.startswith("did_"))
                out.append(
                    f"    {name:26} "
                    + " ".join(f"{_num(c):>8}" for c in cells)
                    + f" {row['seconds']:8.2f}  {did}"
                )
    out.append("other load on the machine meanwhile (cores busy with work not ours), medians:")
    for system, phases in summary["noise_cores"].items():
        out.append(f"  {system:10} " + ", ".join(f"{p} {v:.2f}" for p, v in phases.items()))
    return out
