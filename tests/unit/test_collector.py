"""A service process's garbage collector once it listens (`evora.http.serve.settle_collector`):
the work of a batch of 1,000 submissions sets off no collection of the older generations."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import orjson
import pytest

from evora.collector import GC_YOUNG_THRESHOLD
from evora.http.serve import settle_collector
from evora.protocol.fields import CHECKED_TOGETHER
from evora.protocol.jobs import BatchSubmission

BODY = orjson.dumps(
    {"jobs": [{"queue": "q", "type": "t", "payload": {"i": i}} for i in range(1000)]}
)


@pytest.fixture
def settled() -> Iterator[None]:
    """The collector as a service has it, for this test only."""
    threshold = gc.get_threshold()
    gc.collect()
    settle_collector()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


def collections() -> list[int]:
    return [generation["collections"] for generation in gc.get_stats()]


def test_a_batch_of_submissions_sets_off_no_collection_of_the_older_generations(
    settled: None,
) -> None:
    assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
    assert gc.get_freeze_count() > 0  # what the process built to start is out of every scan
    before = collections()
    for _ in range(20):
        batch = BatchSubmission.model_validate_json(
            BODY, context={"max_payload_bytes": 1 << 20, CHECKED_TOGETHER: True}
        )
        assert len(batch.jobs) == 1000
        del batch
    young, middle, full = (after - b for after, b in zip(collections(), before, strict=True))
    # Python's defaults (700, 10, 10) ran ~13 young collections per batch, a middle one per
    # batch and a full one every ten (docs/benchmarks/2026-11-29-submit-cost.md).
    assert (middle, full) == (0, 0), (young, middle, full)
    assert young <= 2, young
