"""Failure reasons: grouped by error type and normalised message, with the latest example,
job and stack trace, and bounded however many distinct messages workers report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import bson
import pytest
from pymongo.asynchronous.database import AsyncDatabase

from evora.protocol.jobs import JobSubmission
from evora.readmodels.failures import MESSAGE_KEY_CHARS, TRACEBACK_KEPT_CHARS, normalise
from evora.readmodels.layout import Document
from evora.readmodels.reader import ReadModels
from evora.storage.jobs import Failure, JobStore
from evora.storage.outbox import FailureEvent, OutboxCursor
from evora_services.projector import projection
from evora_services.projector.projector import Projector
from tests.projector.conftest import catch_up

# Fifty reasons of at most 200 + 200 + 2000 characters, and their keys: the document's
# ceiling (the traces reported below are 16 KB each, 800 distinct messages in all).
DOC_BYTES_BOUND = 160 * 1024


@pytest.mark.parametrize(
    ("message", "normalised"),
    [
        ("order 1234 not found", "order <n> not found"),
        ("retry 3 of 5.5 after 0.25 s", "retry <n> of <n> after <n> s"),
        ("job 0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b failed", "job <uuid> failed"),
        ("sha deadbeef12 mismatch at 0x7ffd1234", "sha <hex> mismatch at <hex>"),
        ("KeyError: 'user_42' can't be read", "KeyError: '<str>' can't be read"),
        (
            'payload {"id": 17, "name": "ada"} invalid',
            'payload {"<str>": <n>, "<str>": "<str>"} invalid',
        ),
        ("token eyJhbGciOiJIUzI1NiJ9abcDEF123456 expired", "token <token> expired"),
        ("utf8 decoding failed", "utf8 decoding failed"),
    ],
)
def test_normalise_replaces_the_variable_parts(message: str, normalised: str) -> None:
    assert normalise(message) == normalised


def test_normalise_is_bounded() -> None:
    assert len(normalise("word " * 100_000)) == MESSAGE_KEY_CHARS


async def test_failures_group_by_type_and_normalised_message(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    reports = [
        ("order 1234 not found", "LookupError", None),
        ('bad payload {"order": 5678, "note": "gift"}', "ValueError", None),
        ("order 5678 not found", "LookupError", "Traceback ...\n  raise LookupError\n"),
        ('bad payload {"order": 91, "note": "none"}', "ValueError", None),
        ("order 91 not found", "TimeoutError", None),  # another type: another reason
    ]
    await store.submit_batch([JobSubmission(queue="orders", type="ship") for _ in reports])
    jobs = await store.claim(worker_id="w", queues=["orders"], max_jobs=len(reports))
    for job, (message, error_type, trace) in zip(jobs, reports, strict=True):
        await store.fail(
            Failure(job["id"], job["lease_token"], message, error_type, traceback=trace)
        )
    await catch_up(Projector(pool, mongo, 1))

    [ship] = await ReadModels(mongo).failures("orders")
    assert ship["failures"] == 5
    reasons = {(r["type"], r["message"]): r for r in ship["reasons"]}
    assert set(reasons) == {
        ("LookupError", "order <n> not found"),
        ("ValueError", 'bad payload {"<str>": <n>, "<str>": "<str>"}'),
        ("TimeoutError", "order <n> not found"),
    }
    lookup = reasons["LookupError", "order <n> not found"]
    assert lookup["count"] == 2 and ship["reasons"][0]["count"] == 2
    assert lookup["example"] == "order 5678 not found"
    assert lookup["job_id"] == str(jobs[2]["id"])
    assert lookup["traceback"] == "Traceback ...\n  raise LookupError\n"
    assert reasons["TimeoutError", "order <n> not found"]["traceback"] is None


def _letters(n: int) -> str:
    """A word of letters only, one per n (digits would be normalised away)."""
    word = ""
    while True:
        n, letter = divmod(n, 26)
        word += chr(ord("a") + letter)
        if not n:
            return word


def _failed(seq: int, message: str, trace: str) -> FailureEvent:
    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=seq)
    error = {"message": message, "type": "E", "traceback": trace}
    return FailureEvent(OutboxCursor(0, 1, seq), f"job-{seq}", "q", "t", at, error)


async def test_failure_document_stays_bounded(mongo: AsyncDatabase[Document]) -> None:
    """Hundreds of messages that normalise to distinct reasons, each with a long trace,
    projected batch by batch through the updates the projector sends: at most the kept
    number of reasons, each trace cut, and the stored copy equal to the projector's."""
    collection = mongo["failures_bound"]
    doc = projection.new_failures("q", "t")
    trace = "Traceback (most recent call last):\n" + "  frame\n" * 2000 + "E: the end\n"
    seq = 0
    for batch_no in range(40):
        batch = []
        for _ in range(20):
            seq += 1
            batch.append(_failed(seq, f"no {_letters(seq)} in {seq} {'x' * 300}", trace))
        update = projection.apply_to_failures(doc, batch)
        if batch_no == 0:
            await collection.insert_one(doc)
        else:
            result = await collection.update_one({"_id": doc["_id"]}, update)
            assert result.modified_count == 1
    stored = await collection.find_one({"_id": doc["_id"]})
    assert stored is not None and stored["reasons"] == doc["reasons"]
    assert stored["failures"] == seq
    assert len(stored["reasons"]) == projection.FAILURE_REASONS_KEPT
    for reason in stored["reasons"].values():
        assert len(reason["traceback"]) == TRACEBACK_KEPT_CHARS + 1  # "…" + the end
        assert reason["traceback"].endswith("E: the end\n")
        assert len(reason["example"]) == len(reason["message"]) == MESSAGE_KEY_CHARS
    size = len(bson.encode(stored))
    print(f"failure document with {len(stored['reasons'])} reasons: {size} bytes")
    assert size < DOC_BYTES_BOUND
