"""The comparison's arithmetic: medians over repetitions and ratios to the best peer (the
highest rate, the lowest latency, CPU or memory), and the profile summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.profiling import summarize


def _run(system: str, drain: float, p50: float, worker_cpu: float) -> dict[str, Any]:
    phase = {
        "cpu_us_per_job": {"worker": worker_cpu, "mongo-wire stand-in": 1000.0},
        "noise_cores": 0.0,
        "wal_bytes": 1000,
    }
    return {
        "system": system,
        "enqueue": {**phase, "jobs_per_s": 1000.0},
        "drain": {**phase, "jobs_per_s": drain, "jobs": 10},
        "latency": {
            **phase,
            "ms_from_return": {"p50": p50, "p95": p50, "p99": p50},
            "ms_from_call": {"p50": p50},
        },
        "peak_rss_mib": {"worker": 50.0, "producer (enqueue)": 500.0},
    }


def test_ratios_are_against_the_best_peer_in_the_figures_direction() -> None:
    runs = [
        _run("evora", 1000.0, 4.0, 100.0),
        _run("evora", 3000.0, 2.0, 100.0),
        _run("evora", 2000.0, 3.0, 100.0),
        _run("graphile", 4000.0, 1.0, 50.0),
        _run("pgqueuer", 8000.0, 6.0, 200.0),
    ]
    summary = report.summarize(runs)
    assert summary["drain"]["systems"]["evora"] == {"median": 2000.0, "min": 1000.0, "max": 3000.0}
    assert summary["drain"]["best_peer"] == "pgqueuer"
    assert summary["drain"]["ratios_to_best_peer"]["evora"] == pytest.approx(0.25)
    assert summary["p50"]["best_peer"] == "graphile"
    assert summary["p50"]["ratios_to_best_peer"]["evora"] == pytest.approx(3.0)
    # The MongoDB stand-in and the producers are shown per process but not in the totals.
    assert summary["cpu_drain"]["systems"]["evora"]["median"] == 100.0
    assert summary["rss"]["systems"]["evora"]["median"] == 50.0
    assert summary["wal_drain"]["systems"]["evora"]["median"] == 200.0


def test_evoras_variants_and_configurations_are_not_peers() -> None:
    runs = [
        _run("evora", 1000.0, 4.0, 100.0),
        _run("evora-prefetch", 9000.0, 0.5, 100.0),
        _run("evora@base", 8000.0, 0.6, 100.0),
        _run("graphile", 4000.0, 1.0, 50.0),
    ]
    summary = report.summarize(runs)
    assert summary["drain"]["best_peer"] == summary["p50"]["best_peer"] == "graphile"
    assert summary["drain"]["ratios_to_best_peer"]["evora-prefetch"] == pytest.approx(2.25)


def test_profile_summary_ranks_functions_by_samples(tmp_path: Path) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_text(
        "run (loops.py:1);claim (jobs.py:10);execute (connection.py:5) 30\n"
        "run (loops.py:1);ack (routes.py:3) 10\n"
    )
    lines = summarize(raw)
    assert lines[0].startswith("40 samples")
    assert "75.0% execute (connection.py)" in lines[1]
    assert any("75.0% claim (jobs.py)" in line for line in lines)
