"""The per-minute history of a queue: what the projector keeps (bounded to the last day) and
what the api serves from it, on real PostgreSQL and MongoDB."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import asyncpg
import bson
import pytest
from pymongo.asynchronous.database import AsyncDatabase

from evora.protocol.jobs import JobSubmission
from evora.readmodels.layout import Document
from evora.readmodels.stats import (
    HISTORY_HOURS,
    HISTORY_MINUTES,
    MINUTE_FIELDS,
    MINUTE_SECONDS,
    bucket_of,
    minute_of,
)
from evora.storage.jobs import Failure, JobStore
from evora.storage.outbox import NOTHING_VISIBLE, Batch, EventGroup, OutboxCursor
from evora_services.api.stats import encode_key
from evora_services.projector import projection
from evora_services.projector.changes import QueueChange, fold
from evora_services.projector.projector import Projector
from tests.projector.conftest import catch_up, truth
from tests.servers import api_with_read_models

ADMIN = {"Authorization": "Bearer test-admin-token"}
TOKENS = "admin:test-admin-token,producer:test-producer-token"
COUNTED = ("submitted", "completed", "failed", "dead_lettered")
# A queue busy every minute for three days: what its document would hold if the history
# were never trimmed, and what it may hold.
DAYS = 3
DOC_BYTES_BOUND = 160 * 1024
# The minutes one projected batch covers. How many updates reach the stored document is not
# what is checked: 10 sent 432 through the MongoDB stand-in, most of the test's time; 45 sends
# 96, and, no divisor of an hour, makes batches that straddle an hour (and drop one). DAYS
# is a whole number of them, so the newest hour is a full one.
BATCH_MINUTES = 45


@pytest.fixture
async def api_url(db_url: str, mongo_url: str, mongo_db_name: str) -> AsyncIterator[str]:
    async with api_with_read_models(db_url, mongo_url, mongo_db_name, TOKENS) as url:
        yield url


async def _workload(store: JobStore) -> None:
    """In queue `mail`: 4 submitted, 2 completed, 1 failed attempt (retried later), 1
    dead-lettered."""
    await store.submit_batch([JobSubmission(queue="mail", type="send") for _ in range(3)])
    await store.submit(JobSubmission(queue="mail", type="send", max_attempts=1))
    jobs = await store.claim(worker_id="w", queues=["mail"], max_jobs=4)
    assert len(jobs) == 4
    one_attempt = next(j for j in jobs if j["max_attempts"] == 1)
    others = [j for j in jobs if j is not one_attempt]
    for job in others[:2]:
        await store.complete(job["id"], job["lease_token"])
    await store.fail(Failure(others[2]["id"], others[2]["lease_token"], "try again"))
    await store.fail(Failure(one_attempt["id"], one_attempt["lease_token"], "no", None, False))


async def test_history_counts_each_event_in_its_minute(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document], api_url: str
) -> None:
    await _workload(store)
    await store.submit(JobSubmission(queue="other", type="t"))
    await catch_up(Projector(pool, mongo, 1))
    _, totals, _ = await truth(pool)
    assert totals["mail"]["dead_lettered"] == 1 and totals["mail"]["failed"] == 1

    async with aiohttp.ClientSession(headers=ADMIN) as http:
        async with http.get(api_url + "/v1/stats/queues/mail/history?minutes=10") as r:
            assert r.status == 200, await r.text()
            history = await r.json()
        assert history["step_seconds"] == 60
        start = datetime.fromisoformat(history["start"])
        end = datetime.fromisoformat(history["end"])
        assert end - start == timedelta(minutes=10) and start.second == 0
        assert start <= datetime.now(UTC) < end
        for name in COUNTED:
            assert len(history[name]) == 10
            assert sum(history[name]) == totals["mail"].get(name, 0), name
        # the claims and the completions were measured; a quiet minute has no mean
        assert [v for v in history["wait_ms"] if v is not None]
        assert [v for v in history["run_ms"] if v is not None]
        assert history["run_ms"][0] is None

        # the default is the whole day
        async with http.get(api_url + "/v1/stats/queues/mail/history") as r:
            assert len((await r.json())["submitted"]) == HISTORY_MINUTES

        async with http.get(api_url + "/v1/stats/history?minutes=5&limit=1") as r:
            first = await r.json()
        assert [h["queue"] for h in first["history"]] == ["mail"]
        assert first["next"] == encode_key(["mail"])
        async with http.get(api_url + f"/v1/stats/history?minutes=5&after={first['next']}") as r:
            rest = await r.json()
        assert [h["queue"] for h in rest["history"]] == ["other"] and rest["next"] is None
        assert sum(rest["history"][0]["submitted"]) == 1

        async with http.get(api_url + "/v1/stats/queues/nobody/history") as r:
            assert r.status == 404 and (await r.json())["code"] == "queue_not_found"
        for bad in ("minutes=0", f"minutes={HISTORY_MINUTES + 1}", "minutes=x", "since=1"):
            async with http.get(api_url + f"/v1/stats/queues/mail/history?{bad}") as r:
                assert r.status == 422, bad
                assert r.content_type == "application/problem+json"


def _busy(minutes: range) -> QueueChange:
    """Queue `busy` in these minutes, summed up as the outbox reader does: in each, a job
    submitted and one completed after running 250 ms, 30 s into the minute."""
    groups = []
    for position, minute in enumerate(minutes, start=1):
        at = datetime.fromtimestamp(minute * MINUTE_SECONDS + 30, UTC)
        seq = minute * 2
        common: dict[str, Any] = {"queue": "busy", "worker_id": None, "events": 1}
        common["bucket"] = bucket_of(at)
        common |= {"lease_expiry": False, "for_queue": True, "for_worker": False, "wait_n": 0}
        common |= {"wait_ms_sum": 0.0, "last_at": at, "first_at": at}
        groups += [
            EventGroup(
                **common, event="submitted", from_state=None, to_state="PENDING",
                run_ms_sum=0.0, run_n=0, first=2 * position - 1, last=2 * position - 1,
                max_seq=seq, last_cursor=OutboxCursor(0, 1, seq),
            ),
            EventGroup(
                **common, event="completed", from_state="RUNNING", to_state="COMPLETED",
                run_ms_sum=250.0, run_n=1, first=2 * position, last=2 * position,
                max_seq=seq + 1, last_cursor=OutboxCursor(0, 1, seq + 1),
            ),
        ]  # fmt: skip
    batch = Batch(groups, {"busy": ([], [250.0] * len(minutes))}, {}, [], NOTHING_VISIBLE, "")
    return fold(batch)[0]["busy"]


async def test_history_stays_bounded_to_the_last_day(mongo: AsyncDatabase[Document]) -> None:
    """Three days of a queue busy every minute, projected a batch per minute: the stored
    document (written by the same updates the projector sends) keeps only the last day, and
    equals the projector's copy."""
    collection = mongo["history_bound"]
    start = minute_of(datetime(2026, 1, 1, tzinfo=UTC))
    doc = projection.new_queue("busy")
    for first in range(start, start + DAYS * 24 * 60, BATCH_MINUTES):
        batch = _busy(range(first, first + BATCH_MINUTES))
        update = projection.apply_to_queue(doc, batch)
        if first == start:
            await collection.insert_one(doc)
        else:
            result = await collection.update_one({"_id": "busy"}, update)
            assert result.modified_count == 1
    stored = await collection.find_one({"_id": "busy"})
    assert stored is not None
    assert stored["history"] == doc["history"]
    kept = sum(len(minutes) for minutes in stored["history"].values())
    assert HISTORY_MINUTES <= kept <= (HISTORY_HOURS + 1) * 60
    size = len(bson.encode(stored))
    print(f"queue document with a full day of history: {size} bytes, {kept} minutes")
    assert size < DOC_BYTES_BOUND
    newest = max(int(hour) for hour in stored["history"])
    assert min(int(hour) for hour in stored["history"]) == newest - HISTORY_HOURS
    row = stored["history"][str(newest)]["30"]
    assert row[MINUTE_FIELDS.index("run_ms_sum")] == 250.0
    assert row[MINUTE_FIELDS.index("submitted")] == row[MINUTE_FIELDS.index("completed")] == 1
