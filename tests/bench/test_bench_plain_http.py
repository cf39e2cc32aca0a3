"""`python -m bench.plain_http` with tiny counts: the SDK worker and the plain HTTP reference
worker (examples/plain_http_worker.py) each drain their jobs on the same deployment, in
alternating order, the plain one also with its outcomes sent apart from its claims.
Performance is not asserted; that both drained, and the report, are."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from bench import plain_http
from bench.typescript_worker import Deployment, deployment


@pytest.fixture(scope="module")
def on() -> Iterator[Deployment]:
    """One deployment for both ways of acking, as `python -m bench.plain_http` starts one for
    all its rounds (every drain has a queue of its own): starting Evora's services was most
    of each test's time."""
    with deployment() as started:
        yield started


@pytest.mark.parametrize("acks_apart", [False, True], ids=["acks-in-claim", "acks-apart"])
def test_both_workers_drain_every_round_and_the_ratio_is_reported(
    acks_apart: bool, on: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    options = {"jobs": 300, "concurrency": 100, "lanes": 2, "rounds": 2}
    plain_http.compare(argparse.Namespace(**options, acks_apart=acks_apart), on)
    out = capsys.readouterr().out
    drains = re.findall(r"^(sdk|plain-http) +300 jobs in ", out, flags=re.MULTILINE)
    assert drains == ["sdk", "plain-http", "plain-http", "sdk"]  # the order alternates
    assert re.search(r"^sdk +median +\d+ jobs/s over 2 rounds", out, flags=re.MULTILINE)
    assert re.search(r"^plain-http +median +\d+ jobs/s over 2 rounds", out, flags=re.MULTILINE)
    assert re.search(r"^plain-http / sdk: \d+% of the medians; per round \d+%, \d+%", out, re.M)
