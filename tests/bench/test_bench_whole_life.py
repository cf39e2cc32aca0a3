"""`python -m bench compare --whole-life` on Evora with tiny counts: after the run, the
sweeper's audit reads every event, its retention removes every finished job and the events'
partitions (the rows' and their twins of the batches), and each part is measured and
reported; no autovacuum ran meanwhile. Performance is not asserted; the peers (npm, Node,
pgqueuer downloads) are not run here."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench import report
from bench.__main__ import compare
from bench.cluster import Cluster
from bench.workloads import POSTGRES, Workload

JOBS = 1_000
RATE = 20.0
SECONDS = 1.0


async def test_evora_whole_life_measures_the_audit_retention_and_vacuum_of_its_jobs() -> None:
    # idle_s: the worker's wait before the latency run (2 s by default) is not what is checked
    workload = Workload(
        jobs=JOBS, batch=100, rate=RATE, seconds=SECONDS, drain_timeout_s=60.0, idle_s=0.5
    )
    # Not pytest's tmp_path: other pytest sessions on the machine prune those directories.
    with tempfile.TemporaryDirectory(prefix="evora-bench-test-") as tmp:
        directory = Path(tmp)
        with Cluster(directory) as cluster:
            runs = await compare(
                cluster, directory, ["evora"], 1, workload, None, None, None, whole_life=True
            )
    deferred = runs[0]["deferred"]
    finished = JOBS + round(RATE * SECONDS)
    assert deferred["jobs"] == finished
    assert deferred["autovacuum_runs"] == 0
    parts = {part["part"]: part for part in deferred["parts"]}
    assert list(parts) == ["audit", "vacuum after the drain", "retention", "vacuum after retention"]
    # Every job has at least its submitted, claimed and completed events, each read once.
    assert parts["audit"]["did"]["events"] >= 3 * finished
    retention = parts["retention"]["did"]
    assert retention["completed"] == finished
    # ranges of the outbox, each a partition of both its tables (migration 0064)
    assert retention["event_partitions"] >= 1
    # The drain's claims and completions left dead rows; retention's deletes were logged.
    assert parts["vacuum after the drain"]["did"]["dead_tuples_before"] >= finished
    assert parts["vacuum after retention"]["did"]["dead_tuples_before"] >= finished
    assert parts["retention"]["wal_bytes"] > finished * 10
    for part in parts.values():
        assert part["cpu_us_per_job"][POSTGRES] >= 0

    summary = report.summarize(runs)
    assert (
        summary["wal_whole"]["systems"]["evora"]["median"]
        > summary["wal_drain"]["systems"]["evora"]["median"]
    )
    assert list(summary["deferred_parts"]["evora"]["parts"]) == list(parts)
    assert any(line.startswith("deferred work per job") for line in report.lines(summary))
