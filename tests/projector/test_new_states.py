"""A read-model queue document written before a state existed (SUSPENDED, migration 0040)
takes that state's moves: the projector of a new release applies events to documents the
previous release made."""

from __future__ import annotations

from datetime import UTC, datetime

from evora.storage.outbox import OutboxCursor
from evora_services.projector import projection
from evora_services.projector.changes import QueueChange


def test_a_document_without_a_new_state_counts_its_moves() -> None:
    doc = projection.new_queue("q")
    for counts in (doc["transitions"], doc["counts"]):
        del counts["SUSPENDED"]  # as the previous release made it
    doc["transitions"]["RUNNING"] = doc["counts"]["RUNNING"] = 1
    now = datetime.now(UTC)
    change = QueueChange(
        "q",
        OutboxCursor(),
        now,
        0,
        moved={"RUNNING": -1, "SUSPENDED": 1},
        totals={"suspended": 1},
        minutes={int(now.timestamp()) // 60: {"suspended": 1}},
    )
    update = projection.apply_to_queue(doc, change)
    assert (doc["counts"]["RUNNING"], doc["counts"]["SUSPENDED"]) == (0, 1)
    assert update["$inc"]["counts.SUSPENDED"] == 1
    projection.recount(doc)
    assert doc["counts"]["SUSPENDED"] == 1
