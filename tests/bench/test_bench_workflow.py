"""`python -m bench workflow` with tiny counts: the services as processes, the SDK worker in
its own process, a fan-out/fan-in whose fan-in is a tree of joins, and the same jobs without
dependencies. Performance is not asserted; the order of the workflow is."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from bench import workflow
from bench.cluster import Cluster
from evora.protocol.bounds import MAX_DEPENDENCIES

# 2,000 children in groups of 10: 200 group joins under the final join. Enough submitting
# that the api's CPU spans several of /proc's 10 ms clock ticks (with 25 children it read 0
# on a fast host).
SHAPE = workflow.Shape(children=2_000, fan_in=10, batch=200, timeout_s=60.0)


def test_the_shape_is_a_tree_of_joins_only_past_the_fan_in_limit() -> None:
    small = workflow.Shape(children=25, fan_in=10, batch=10)  # three group joins
    assert (small.groups, small.jobs, small.final) == (3, 30, 29)
    assert [small.group_of(c) for c in (1, 10, 11, 25)] == [26, 26, 27, 28]
    default = workflow.Shape()
    assert (default.children, default.fan_in) == (10_000, MAX_DEPENDENCIES)
    assert (default.groups, default.jobs) == (10, 10_012)
    assert workflow.Shape(children=MAX_DEPENDENCIES).groups == 0  # one join holds them all
    with pytest.raises(ValueError, match="fan_in"):
        workflow.Shape(fan_in=MAX_DEPENDENCIES + 1)
    with pytest.raises(ValueError, match="group joins"):
        workflow.Shape(children=10_000, fan_in=10)  # 1,000 group joins and a final one


async def test_the_workflow_runs_in_order_once_and_is_measured() -> None:
    # Not pytest's tmp_path: other pytest sessions on the machine prune those directories,
    # and PostgreSQL's data directory must outlive the test.
    with tempfile.TemporaryDirectory(prefix="evora-bench-test-") as tmp:
        directory = Path(tmp)
        with Cluster(directory) as cluster:
            runs = await workflow.compare(cluster, directory, SHAPE, 1)

    plain, flow = runs
    assert (plain["kind"], flow["kind"]) == ("plain", "workflow")
    assert (plain["drain"]["handled"], plain["drain"]["duplicates"]) == (SHAPE.jobs, 0)
    run = flow["run"]
    assert (run["handled"], run["duplicates"]) == (SHAPE.jobs, 0)
    # nothing started before what it waits for was done
    assert run["fan_out_first_child_s"] > 0
    assert run["fan_out_last_child_s"] >= run["fan_out_first_child_s"]
    assert run["group_join_min_delay_ms"] > 0
    assert run["fan_in_final_join_s"] > 0
    assert run["children_per_s"] > 0
    assert 0 < run["wall_db_s"] <= run["wall_s"] < SHAPE.timeout_s
    assert flow["submit"]["jobs_per_s"] > 0
    assert flow["submit"]["cpu_us_per_job"]["api"] > 0
    for process in ("api", "dispatcher", "sweeper", "projector", "worker"):
        assert 10 < flow["peak_rss_mib"][process] < 2_000, process

    summary = workflow.summarize(runs)
    assert {(f["kind"], f["label"]) for f in summary} == {
        (f.kind, f.label) for f in workflow.FIGURES
    }
    text = "\n".join(workflow.lines(SHAPE, summary))
    assert "200 group joins of up to 10 children each" in text
    assert "the same jobs without dependencies" in text
