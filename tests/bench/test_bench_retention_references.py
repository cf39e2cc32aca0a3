"""`python -m bench.retention_references` with tiny counts: both variants prune every job and
leave no referencing row behind (the figures are not asserted)."""

from __future__ import annotations

import pytest

from bench import retention_references


def test_both_variants_prune_every_job_and_its_references(
    capsys: pytest.CaptureFixture[str],
) -> None:
    retention_references.main(["--jobs", "300", "--rounds", "1", "--references-every", "3"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["trigger", "cascade"]
    for line in lines:
        assert "pruned     300:" in line, line
        assert line.endswith("rows of other tables left 0"), line
