"""`python -m bench compare --pressure` and `--soak` with tiny periods, Evora only (the peers,
npm, Node and pgqueuer downloads, are not run here): the pinning session is held in another
database and in Evora's own, the soak runs a few short buckets, and the JSON has every field
the report reads. Performance is not asserted."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from bench import pressure
from bench.children import Children
from bench.cluster import Cluster
from bench.evora_system import EvoraSystem
from bench.system import System

RATE = 40.0


async def test_pressure_reports_every_period_with_the_read_models_lag() -> None:
    p = pressure.Pressure(
        rate=RATE, clean_s=4.0, pinned_s=4.0, after_s=2.0, pin_in=pressure.PIN_PLACES
    )
    # Not pytest's tmp_path: other pytest sessions on the machine prune those directories,
    # and PostgreSQL's data directory must outlive the test.
    with tempfile.TemporaryDirectory(prefix="evora-bench-test-") as tmp:
        directory = Path(tmp)
        with Cluster(directory) as cluster:

            def make(name: str, children: Children) -> System:
                return EvoraSystem(children, cluster.mongo_url)

            runs = await pressure.compare_pressure(cluster, directory, ["evora"], p, make)
    assert [(r["system"], r["pin_in"]) for r in runs] == [("evora", "other"), ("evora", "same")]
    for run in runs:
        _check(run)
        assert any(line.startswith("  pinned ") for line in pressure.pressure_lines(run))


def _check(run: dict[str, Any]) -> None:
    assert run["handled"] == run["offered"] == round(RATE * 10.0)
    assert run["duplicates"] == 0
    assert run["pinned_at"] < run["released_at"]
    assert math.isfinite(run["pinned_over_clean"])
    for name in pressure.PERIODS:
        period = run["periods"][name]
        assert period["completed_per_s"] > 0, name
        assert math.isfinite(period["wake_ms"]["p99"]), name
        assert period["read_model_max_lag_s"] >= 0, name
        # Evora's tables were sampled, partitions with their root.
        assert "evora.jobs" in period["tables"], name
        assert "evora.job_events" in period["tables"], name
    truths = [s["truth"] for s in run["samples"]]
    assert truths[-1] == run["handled"]  # every job completed in PostgreSQL, and sampled
    assert all(s["read_model"] is not None for s in run["samples"])


def test_read_model_lag_is_the_age_of_the_truth_it_shows() -> None:
    samples: list[dict[str, Any]] = [
        {"t": 0.0, "truth": 0, "read_model": 0},
        {"t": 1.0, "truth": 10, "read_model": 0},
        {"t": 2.0, "truth": 20, "read_model": 10},
        {"t": 3.0, "truth": 30, "read_model": 30},
        {"t": 4.0, "truth": 40, "read_model": None},
        {"t": 5.0, "truth": 50, "read_model": 35},  # 35 was reached half way from 3.0 to 4.0
        {"t": 6.0, "truth": 60, "read_model": -1},  # behind every sample: a lower bound
    ]
    assert pressure.read_model_lags(samples) == [0.0, 1.0, 1.0, 0.0, None, 1.5, 6.0]


async def test_soak_reports_every_minute_and_a_verdict_per_process_and_table() -> None:
    # Three "minutes" of 4.5 s over a 12 s offer: the last call falls mid-way through the
    # third, so a producer running late still makes exactly three rows; samples every 0.5 s
    # put several in each.
    s = pressure.Soak(minutes=0.2, rate=RATE, warmup_minutes=0, sample_s=0.5, bucket_s=4.5)
    with tempfile.TemporaryDirectory(prefix="evora-bench-test-") as tmp:
        directory = Path(tmp)
        with Cluster(directory) as cluster:
            result = await pressure.soak(cluster, directory, s)
    assert result["handled"] == result["offered"] == round(RATE * 12)
    assert len(result["minutes"]) == 3
    verdicts = result["verdicts"]
    for process in ("api", "dispatcher", "sweeper", "projector", "worker"):
        assert isinstance(verdicts[f"RSS {process}"]["flat"], bool), process
    assert "RSS producer (bench)" not in verdicts
    assert isinstance(verdicts["wake p99"]["flat"], bool)
    lines = pressure.soak_lines(s, result)
    rows = [line.split(" | ", 1)[0] for line in lines if line[:3] in ("| 1", "| 2", "| 3")]
    assert rows == ["| 1", "| 2", "| 3"]
