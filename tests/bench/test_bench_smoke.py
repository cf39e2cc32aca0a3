"""Evora's side of the comparative benchmark (`python -m bench compare`) with tiny counts:
the harness starts PostgreSQL, MongoDB-wire, `evora migrate`, the four services and an SDK
worker, and produces sane figures. Performance is not asserted; the peers (npm, Node,
pgqueuer downloads) are not run here. The same checkout also runs as a variant
(`--evora-variant`), the way an A/B runs another checkout's services."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from bench import report
from bench.__main__ import compare
from bench.cluster import Cluster
from bench.system import REPO
from bench.workloads import Workload

# Enough work that every process's CPU in its phase spans several of /proc's clock ticks
# (10 ms): with 300 jobs the api's enqueue took 2-3 ms of CPU on a fast host and read 0.
JOBS = 3_000
RATE = 50.0
SECONDS = 2.0
# The worker idle before the latency run: what is measured there is not asserted, only that
# the run is measured (the default 2 s was 6 s of the test's wall time over its 3 systems).
IDLE_S = 0.5


async def test_evora_run_drains_every_job_and_measures_latency_cpu_and_memory() -> None:
    # Handlers of 1 ms: the option that gives jobs a duration reaches the worker.
    workload = Workload(
        jobs=JOBS,
        batch=100,
        rate=RATE,
        seconds=SECONDS,
        drain_timeout_s=60.0,
        handler_ms=1.0,
        idle_s=IDLE_S,
    )
    # Not pytest's tmp_path: other pytest sessions on the machine prune those directories,
    # and PostgreSQL's data directory must outlive the test.
    with tempfile.TemporaryDirectory(prefix="evora-bench-test-") as tmp:
        directory = Path(tmp)
        with Cluster(directory) as cluster:
            systems = ["evora", "evora@same", "evora-prefetch"]
            variants = {"same": REPO}
            runs = await compare(cluster, directory, systems, 1, workload, None, None, variants)
    assert [r["system"] for r in runs] == systems
    for run in runs:
        _check(run)

    summary = report.summarize(runs)
    for system, run in zip(systems, runs, strict=True):
        assert summary["drain"]["systems"][system]["median"] == run["drain"]["jobs_per_s"]
    assert any(line.startswith("  evora@same") for line in report.lines(summary))


def _check(run: dict[str, Any]) -> None:

    assert run["enqueue"]["jobs_per_s"] > 0
    drain = run["drain"]
    assert (drain["handled"], drain["duplicates"]) == (JOBS, 0)
    assert drain["jobs_per_s"] > 0
    latency = run["latency"]
    assert latency["offered"] == latency["handled"] == round(RATE * SECONDS)
    for percentile in ("p50", "p95", "p99"):
        assert math.isfinite(latency["ms_from_return"][percentile])
        assert 0 < latency["ms_from_call"][percentile] < 30_000
    # Every Evora process was measured: CPU in the phase where it works, peak memory.
    assert run["enqueue"]["cpu_us_per_job"]["api"] > 0
    assert run["drain"]["cpu_us_per_job"]["dispatcher"] > 0
    assert run["drain"]["cpu_us_per_job"]["worker"] > 0
    assert run["drain"]["cpu_us_per_job"]["postgresql"] > 0
    for process in ("api", "dispatcher", "sweeper", "projector", "worker"):
        assert 10 < run["peak_rss_mib"][process] < 2_000, process
    assert run["after_drain"]["projector_catch_up_s"] >= 0
    # Jobs and their events were written durably: WAL grew by at least a row per job.
    assert run["enqueue"]["wal_bytes"] > JOBS * 100
    claimed = run["drain"]["counters"][
        "dispatcher:evora_dispatcher_jobs_claimed_total{queue=bench}"
    ]
    assert claimed == JOBS
