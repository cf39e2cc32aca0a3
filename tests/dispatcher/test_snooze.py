"""POST /v1/jobs/{id}/snooze (docs/jobs-that-wait.md): the job runs again after the delay,
its attempt number does not grow and max_attempts is not used up; the event is `snoozed`,
told apart from a release, and `snoozes` counts them."""

from __future__ import annotations

from uuid import uuid4

import asyncpg
import pytest

from evora.protocol.bounds import MAX_SNOOZE_SECONDS
from evora.storage.jobs import JobStore
from tests.conftest import Clock
from tests.dispatcher.conftest import Dispatcher
from tests.dispatcher.test_worker_api import claim, submit

SNOOZES = 5


async def test_snoozing_uses_up_no_attempt(
    dispatcher: Dispatcher, store: JobStore, pool: asyncpg.Pool, pg_server_url: str, db_url: str
) -> None:
    # The dispatcher's connections see the clock move too, for the delays it sets. Claims go
    # to the store: the dispatcher's own claim path keeps real-time wake-up timers.
    clock = Clock(pg_server_url, db_url, [pool, dispatcher.state.store._pool])
    job_id = await submit(store, max_attempts=1)
    for n in range(1, SNOOZES + 1):
        [job] = await store.claim(worker_id="w1", queues=["q"])
        assert (str(job["id"]), job["attempt"]) == (job_id, 1)
        status, snoozed = await dispatcher.post(
            f"/v1/jobs/{job_id}/snooze",
            {"lease_token": str(job["lease_token"]), "delay_seconds": 60},
        )
        assert status == 200, snoozed
        assert (snoozed["state"], snoozed["attempt"], snoozed["snoozes"]) == ("PENDING", 0, n)
        assert await store.claim(worker_id="w1", queues=["q"]) == []  # not due for a minute
        await clock.advance(61)
    [job] = await store.claim(worker_id="w1", queues=["q"])
    status, failed = await dispatcher.post(
        f"/v1/jobs/{job_id}/fail",
        {"lease_token": str(job["lease_token"]), "error": {"message": "gave up"}},
    )
    assert status == 200, failed
    # one counted attempt, and max_attempts=1 allows exactly one: the failure dead-letters
    assert (failed["state"], failed["attempt"], failed["snoozes"]) == ("DLQ", 1, SNOOZES)
    events = await store.events(job["id"])
    assert [(e["event"], e["attempt"]) for e in events] == [
        ("submitted", 0),
        *[("claimed", 1), ("snoozed", 0)] * SNOOZES,
        ("claimed", 1),
        ("dead_lettered", 1),
    ]
    assert all(e["data"]["retry_at"] for e in events if e["event"] == "snoozed")


async def test_a_snooze_is_fenced_and_a_cancel_wins(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    job_id = await submit(store)
    [job] = await claim(dispatcher)
    body = {"lease_token": str(uuid4()), "delay_seconds": 1}
    assert (await dispatcher.post(f"/v1/jobs/{job_id}/snooze", body))[0] == 409
    assert (await dispatcher.post(f"/v1/jobs/{uuid4()}/snooze", body))[0] == 404
    await store.cancel(job["id"])
    body["lease_token"] = job["lease_token"]
    status, cancelled = await dispatcher.post(f"/v1/jobs/{job_id}/snooze", body)
    assert (status, cancelled["state"], cancelled["snoozes"]) == (200, "CANCELLED", 0)
    # the attempt is over: a repeat finds no lease
    assert (await dispatcher.post(f"/v1/jobs/{job_id}/snooze", body))[0] == 409


@pytest.mark.parametrize("delay", [0, -1, MAX_SNOOZE_SECONDS + 1, None])
async def test_a_snooze_needs_a_delay_within_bounds(
    dispatcher: Dispatcher, store: JobStore, delay: float | None
) -> None:
    job_id = await submit(store)
    [job] = await claim(dispatcher)
    status, problem = await dispatcher.post(
        f"/v1/jobs/{job_id}/snooze", {"lease_token": job["lease_token"], "delay_seconds": delay}
    )
    assert status == 422, problem
    assert (await store.get(job["id"]))["state"] == "RUNNING"
