"""`python -m bench compare --pressure` and `--soak` with tiny periods, Evora only (the peers,
npm, Node and pgqueuer downloads, are not run here): the pinning session is held in another
database and in Evora's own, the soak runs a few short buckets, and the JSON has every field
the report reads. Performance is not asserted."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import pressure
from bench.children import Children
from bench.cluster import Cluster
from bench.evora_system import EvoraSystem
from bench.system import System

RATE = 40.0
# Each period long enough for the producer to be offering in it (its first call comes an
# interpreter's start after the clean period's clock began: the clean period measured 2 s
# of its 3 at a load average of 8), sampled every 0.25 s so that each period holds several
# samples (was 4 + 4 + 2 s sampled every second).
PRESSURE = pressure.Pressure(
    rate=RATE,
    clean_s=3.0,
    pinned_s=2.0,
    after_s=1.5,
    pin_in=pressure.PIN_PLACES,
    sample_s=0.25,
)
OFFER_S = PRESSURE.clean_s + PRESSURE.pinned_s + PRESSURE.after_s


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """One PostgreSQL and MongoDB stand-in for the file's runs, as `python -m bench compare`
    keeps one for all of its: every run has databases of its own."""
    # Not pytest's tmp_path: other pytest sessions on the machine prune those directories,
    # and PostgreSQL's data directory must outlive the test.
    with (
        tempfile.TemporaryDirectory(prefix="evora-bench-test-") as tmp,
        Cluster(Path(tmp)) as started,
    ):
        yield started


async def test_pressure_reports_every_period_with_the_read_models_lag(cluster: Cluster) -> None:
    def make(name: str, children: Children) -> System:
        return EvoraSystem(children, cluster.mongo_url)

    runs = await pressure.compare_pressure(cluster, cluster.directory, ["evora"], PRESSURE, make)
    assert [(r["system"], r["pin_in"]) for r in runs] == [("evora", "other"), ("evora", "same")]
    for run in runs:
        _check(run)
        assert any(line.startswith("  pinned ") for line in pressure.pressure_lines(run))


def _check(run: dict[str, Any]) -> None:
    assert run["handled"] == run["offered"] == round(RATE * OFFER_S)
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
        # the outbox: a view of two tables since migration 0064
        assert "evora.job_event_rows" in period["tables"], name
        assert "evora.event_batches" in period["tables"], name
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


async def test_soak_reports_every_minute_and_a_verdict_per_process_and_table(
    cluster: Cluster,
) -> None:
    # Three "minutes" of 2.5 s over a 6 s offer: the last call falls 1 s into the third, so
    # a producer running up to 1.5 s late still makes exactly three rows; samples every 0.5 s
    # put several in each (was 4.5 s over 12 s: the offer is most of the test's time).
    s = pressure.Soak(minutes=0.1, rate=RATE, warmup_minutes=0, sample_s=0.5, bucket_s=2.5)
    result = await pressure.soak(cluster, cluster.directory, s)
    assert result["handled"] == result["offered"] == round(RATE * 6)
    assert len(result["minutes"]) == 3
    verdicts = result["verdicts"]
    for process in ("api", "dispatcher", "sweeper", "projector", "worker"):
        assert isinstance(verdicts[f"RSS {process}"]["flat"], bool), process
    assert "RSS producer (bench)" not in verdicts
    assert isinstance(verdicts["wake p99"]["flat"], bool)
    lines = pressure.soak_lines(s, result)
    rows = [line.split(" | ", 1)[0] for line in lines if line[:3] in ("| 1", "| 2", "| 3")]
    assert rows == ["| 1", "| 2", "| 3"]
