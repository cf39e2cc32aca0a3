"""`python -m bench.shapes` with tiny counts: every shape submits, drains, vacuums and
removes its jobs (the script asserts that every job was drained and that retention left none
of them, in any table of the shape), and each phase is measured and reported with the WAL by
relation. No figure is asserted but that each shape wrote WAL to its own tables."""

from __future__ import annotations

import re
import subprocess
import sys

from bench.shapes import SHAPES
from bench.system import REPO


def test_every_shape_lives_a_whole_life_and_is_measured() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.shapes", "--jobs", "300", "--rounds", "1", "--batch", "50"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    whole = dict(re.findall(r"^  (\S+):\n(?:    .*\n)*?    whole life +WAL +([\d,]+) B", out, re.M))
    assert set(whole) == set(SHAPES), out
    assert all(int(wal.replace(",", "")) > 0 for wal in whole.values()), out
    own = {
        "graphile": "graphile._private_jobs",
        "today": "evora.jobs",
        "split": "split.ready",
        "split-batch": "split_batch.running",
        "split-batch-gin": "split_batch_gin.events_p*_job_ids_idx",
        "split-batch-lean": "split_batch_lean.finished_p*",
    }
    for shape, relation in own.items():
        assert re.search(rf"^  {shape} drain: .*{re.escape(relation)} \d", out, re.M) or re.search(
            rf"^  {shape} whole life: .*{re.escape(relation)} \d", out, re.M
        ), (shape, out)
    assert re.search(r"^  split-batch +[\d.]+x", out, re.M), out
    # Evora as it is writes a claim's and a completion's events as one batch (migration 0064)
    assert re.search(r"^  today drain: .*evora\.event_batches_p\* \d", out, re.M), out
