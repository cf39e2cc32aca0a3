"""The PostgreSQL profiler of the benchmarks (bench/pgperf.py) through `python -m bench.drain_pg
--perf DIR --statements`, with tiny counts: the drain is recorded, its samples are kept to the
cluster's backends and sorted by kind of work, and pg_stat_statements shows the statements
inside the hot path's functions. No figure is asserted; without `perf` on the machine (or the
right to use it) the test is skipped."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile

import pytest

from bench.system import REPO


def _perf_works() -> bool:
    if shutil.which("perf") is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        probe = subprocess.run(
            ["perf", "record", "-o", f"{tmp}/probe.data", "--", "true"],
            capture_output=True,
            check=False,
        )
    return probe.returncode == 0


@pytest.mark.skipif(not _perf_works(), reason="perf is missing or not allowed here")
def test_drain_pg_profiles_the_drain_by_kind_of_work_and_statement() -> None:
    with tempfile.TemporaryDirectory(prefix="evora-pgperf-test-") as tmp:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.drain_pg",
                "--rounds",
                "1",
                "--jobs",
                "2000",
                "--history",
                "500",
                "--perf",
                tmp,
                "--statements",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        ).stdout
    assert "samples of the cluster" in out, out
    assert "by kind of work" in out and "index insert" in out, out
    assert "evora.complete_items" in out and "evora.claim_jobs" in out, out
