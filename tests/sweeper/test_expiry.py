"""Lease and TTL expiry through the running sweeper loop: the exact events each path writes,
and waking at the next deadline instead of on a fixed tick."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import asyncpg

from evora.storage.jobs import Failure, JobStore
from evora_services.sweeper.sweeper import Tuning
from tests.conftest import Clock
from tests.polling import until
from tests.sweeper.conftest import (
    FAST,
    StartSweeper,
    claimed,
    counted,
    event_names,
    events,
    submit,
)

LONG_AGO = datetime(2001, 1, 1, tzinfo=UTC)
LEASE_EXPIRED = {
    "message": "the lease expired before the worker reported an outcome",
    "type": "lease_expired",
}


async def test_expired_lease_goes_back_to_pending_with_backoff(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    job = await claimed(store, max_attempts=3, backoff={"initial_seconds": 60, "max_seconds": 60})
    await clock.advance(job["lease_seconds"] + 1)
    running = await start_sweeper()

    async def expired() -> bool:
        return len(await event_names(pool, job["id"])) == 3

    await until(expired, "the lease to be expired")
    [_, _, (name, data)] = await events(pool, job["id"])
    assert name == "lease_expired"
    # requeued: no reason, but when it may run again and what went wrong
    assert set(data) == {"retry_at", "error"}
    assert data["error"]["type"] == "lease_expired"
    current = await store.get(job["id"])
    assert current["last_error"] == data["error"]
    assert current["state"] == "PENDING" and current["attempt"] == 1
    assert current["lease_expires_at"] is None
    # backoff 60 s (+-20 % jitter) from the expiry
    assert current["run_at"] > datetime.now(UTC) + timedelta(seconds=40)
    await counted(running, "evora_sweeper_leases_expired_total", outcome="requeued")


async def test_expired_lease_with_no_attempts_left_is_dead_lettered(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    job = await claimed(store, max_attempts=1)
    await clock.advance(job["lease_seconds"] + 1)
    running = await start_sweeper()

    async def dead() -> bool:
        return len(await event_names(pool, job["id"])) == 3

    await until(dead, "the job to be dead-lettered")
    assert await events(pool, job["id"]) == [
        ("submitted", {}),
        ("claimed", {}),
        ("dead_lettered", {"reason": "lease_expired", "error": LEASE_EXPIRED}),
    ]
    stored = await store.get(job["id"])
    # The dead job says why it died (the dashboard shows last_error).
    assert stored["state"] == "DLQ" and stored["last_error"] == LEASE_EXPIRED
    await counted(running, "evora_sweeper_leases_expired_total", outcome="dead_lettered")


async def test_expired_lease_of_a_cancel_requested_job_cancels_it(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    job = await claimed(store, max_attempts=5)
    assert not (await store.cancel(job["id"])).immediate
    await clock.advance(job["lease_seconds"] + 1)
    running = await start_sweeper()

    async def cancelled() -> bool:
        return len(await event_names(pool, job["id"])) == 4

    await until(cancelled, "the job to be cancelled")
    assert await events(pool, job["id"]) == [
        ("submitted", {}),
        ("claimed", {}),
        ("cancel_requested", {}),
        ("cancelled", {"reason": "cancel_requested"}),
    ]
    assert (await store.get(job["id"]))["state"] == "CANCELLED"
    await counted(running, "evora_sweeper_leases_expired_total", outcome="cancelled")


async def test_ttl_spares_a_job_that_started_and_waits_for_its_retry(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    soon = datetime.now(UTC) + timedelta(hours=1)
    job = await claimed(store, "retrying", max_attempts=3, expires_at=soon)
    await store.fail(Failure(job["id"], job["lease_token"], "flaky", retry_in_seconds=0))
    # Its time-to-live runs out while it waits for the retry: it already started, so the TTL
    # (meant for jobs that never ran) no longer applies.
    await clock.advance(2 * 3600)
    running = await start_sweeper()
    expired = await submit(store, "expired", expires_at=LONG_AGO)
    await until(
        lambda: running.metric("evora_sweeper_ttls_expired_total") == 1, "the unstarted TTL"
    )
    seen = running.metric("evora_sweeper_last_run_timestamp_seconds")
    await until(
        lambda: running.metric("evora_sweeper_last_run_timestamp_seconds") > seen,
        "another pass",
    )
    assert (await store.get(expired))["state"] == "DLQ"
    assert (await store.get(job["id"]))["state"] == "PENDING"
    [again] = await store.claim(worker_id="w", queues=["retrying"])
    assert again["id"] == job["id"] and again["attempt"] == 2


async def test_ttl_expiry_dead_letters_only_jobs_that_never_started(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    now = datetime.now(UTC)
    started = await claimed(
        store, "started", expires_at=now + timedelta(minutes=1), lease_seconds=3600
    )
    unlimited = await submit(store, "unlimited")
    later = await submit(store, "later", expires_at=now + timedelta(hours=1))
    # Its time-to-live ran out after it started: a RUNNING job is not the TTL's business.
    await clock.advance(120)
    running = await start_sweeper()
    expired = await submit(store, "expired", expires_at=LONG_AGO)

    async def dead() -> bool:
        return len(await event_names(pool, expired)) == 2

    await until(dead, "the TTL to be expired")
    assert await events(pool, expired) == [
        ("submitted", {}),
        ("dead_lettered", {"reason": "expired"}),
    ]
    job = await store.get(expired)
    assert job["state"] == "DLQ" and job["attempt"] == 0
    await counted(running, "evora_sweeper_ttls_expired_total")

    # After one more full pass, the others are as they were.
    seen = running.metric("evora_sweeper_last_run_timestamp_seconds")
    await until(
        lambda: running.metric("evora_sweeper_last_run_timestamp_seconds") > seen,
        "another pass",
    )
    assert (await store.get(started["id"]))["state"] == "RUNNING"
    assert (await store.get(unlimited))["state"] == "PENDING"
    assert (await store.get(later))["state"] == "PENDING"


async def test_wakes_at_the_next_deadline_not_on_a_tick(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool
) -> None:
    job = await claimed(store, "leased", lease_seconds=3600)
    # Deadlines a second or two ahead of the real time, set directly: what is tested is the
    # sweeper sleeping on the real clock until them, which running the `clock` ahead cannot
    # stand for.
    lease_deadline = await pool.fetchval(
        "UPDATE evora.jobs SET lease_expires_at = now() + interval '1.2 s' WHERE id = $1 "
        "RETURNING lease_expires_at",
        job["id"],
    )
    ttl_job = await submit(store, "ttl", expires_at=datetime.now(UTC) + timedelta(hours=1))
    ttl_deadline = await pool.fetchval(
        "UPDATE evora.jobs SET expires_at = now() + interval '1.8 s' WHERE id = $1 RETURNING"
        " expires_at",
        ttl_job,
    )
    # Without the deadline it would look again only after a minute.
    await start_sweeper(Tuning(max_wait=60.0))

    async def expired_at(job_id: object, event: str) -> datetime | None:
        at: datetime | None = await pool.fetchval(
            "SELECT at FROM evora.job_events WHERE job_id = $1 AND event = $2", job_id, event
        )
        return at

    async def both_expired() -> bool:
        return (
            await expired_at(job["id"], "lease_expired") is not None
            and await expired_at(ttl_job, "dead_lettered") is not None
        )

    await until(both_expired, "both deadlines to be acted on", within=6.0)
    lease_late = (await expired_at(job["id"], "lease_expired") - lease_deadline).total_seconds()
    ttl_late = (await expired_at(ttl_job, "dead_lettered") - ttl_deadline).total_seconds()
    assert 0 <= lease_late < 0.5, lease_late
    assert 0 <= ttl_late < 0.5, ttl_late


async def test_looks_again_for_leases_claimed_after_it_computed_its_deadline(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool
) -> None:
    # Nothing to wait for, so the sweeper sleeps its longest wait (1 s by default).
    running = await start_sweeper(Tuning(max_wait=1.0, standby_seconds=FAST.standby_seconds))
    await until(
        lambda: running.metric("evora_sweeper_last_run_timestamp_seconds") > 0, "a first pass"
    )
    job = await claimed(store, lease_seconds=1)  # a real one-second lease
    started = time.monotonic()

    async def expired() -> bool:
        return "lease_expired" in await event_names(pool, job["id"])

    await until(expired, "the short lease to be expired", within=5.0)
    assert time.monotonic() - started < 1.0 + 1.0 + 0.5  # the lease, at most one wait, slack
    late = await pool.fetchval(
        "SELECT extract(epoch FROM e.at - $2::timestamptz)::float8 FROM evora.job_events e "
        "WHERE e.job_id = $1 AND e.event = 'lease_expired'",
        job["id"],
        job["lease_expires_at"],
    )
    assert 0 <= late < 1.2, late


async def test_a_callback_past_its_timeout_is_settled_by_the_running_sweeper(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    """docs/callbacks.md: timeouts are swept like leases, each by its on_timeout."""
    resumed, failed = await claimed(store, max_attempts=1), await claimed(store, max_attempts=1)
    for job, on_timeout in ((resumed, "resume"), (failed, "fail")):
        await store.suspend(
            job["id"], job["lease_token"], timeout_seconds=60, on_timeout=on_timeout
        )
    await clock.advance(61)
    running = await start_sweeper()

    async def settled() -> bool:
        return [len(await event_names(pool, j["id"])) for j in (resumed, failed)] == [4, 4]

    await until(settled, "both callbacks to be settled")
    assert (await event_names(pool, resumed["id"]))[-1] == "resumed"
    assert (await event_names(pool, failed["id"]))[-1] == "dead_lettered"
    assert (await store.get(resumed["id"]))["state"] == "PENDING"
    assert (await store.get(failed["id"]))["state"] == "DLQ"
    await counted(running, "evora_sweeper_callbacks_timed_out_total", outcome="resumed")
    await counted(running, "evora_sweeper_callbacks_timed_out_total", outcome="dead_lettered")


async def test_wakes_at_the_next_callback_timeout(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool
) -> None:
    """docs/callbacks.md: a timeout is settled when it passes, not at the sweeper's next look
    (it used to sleep until the next lease, TTL or time limit only, so up to `max_wait`)."""
    job = await claimed(store, "suspended", max_attempts=1)
    await store.suspend(job["id"], job["lease_token"], timeout_seconds=1.5, on_timeout="resume")
    deadline = await pool.fetchval(
        "SELECT timeout_at FROM evora.callbacks WHERE job_id = $1", job["id"]
    )
    # Without the deadline it would look again only after a minute.
    await start_sweeper(Tuning(max_wait=60.0))

    async def resumed_at() -> datetime | None:
        at: datetime | None = await pool.fetchval(
            "SELECT at FROM evora.job_events WHERE job_id = $1 AND event = 'resumed'", job["id"]
        )
        return at

    async def resumed() -> bool:
        return await resumed_at() is not None

    await until(resumed, "the callback's timeout to be settled", within=6.0)
    at = await resumed_at()
    assert at is not None
    late = (at - deadline).total_seconds()
    assert 0 <= late < 0.5, late
