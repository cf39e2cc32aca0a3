"""A hard time limit per attempt (`max_duration_seconds`, docs/jobs-that-wait.md): past it
every heartbeat answers `timeout_requested`, though it still extends the lease; once the
grace (the job's lease_seconds) has passed too, the sweeper's `time_out` statement revokes
the lease and fails the attempt with reason `timeout`, retried per the job's policy and
dead-lettered when its attempts are used up. A completion or heartbeat racing that sweep:
the one that holds the row first decides, and exactly one outcome is recorded."""

from __future__ import annotations

import asyncio
from collections import Counter

import asyncpg
import pytest

from evora.domain.errors import LeaseLost
from evora.storage import queries
from evora.storage.jobs import JobStore
from evora_services.sweeper.sweeper import Tuning
from tests.conftest import Clock
from tests.polling import until, waits_for_a_lock
from tests.sweeper.conftest import StartSweeper, claimed, event_names, events

LIMIT = 10
LEASE = 5
ROUNDS = 20


async def test_past_its_limit_an_attempt_is_asked_to_stop_then_failed_after_the_grace(
    store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    job = await claimed(
        store,
        "tl",
        max_duration_seconds=LIMIT,
        lease_seconds=LEASE,
        max_attempts=2,
        backoff={"initial_seconds": 1, "max_seconds": 1},
    )
    unlimited = await claimed(store, "free", lease_seconds=3600)
    assert job["max_duration_seconds"] == LIMIT and unlimited["max_duration_seconds"] is None
    assert not (await store.heartbeat(job["id"], job["lease_token"])).timeout_requested

    await clock.advance(LIMIT)
    beat = await store.heartbeat(job["id"], job["lease_token"])
    # asked to stop, and the lease still extended: the worker needs it to report
    assert beat.timeout_requested
    assert not (await store.heartbeat(unlimited["id"], unlimited["lease_token"])).timeout_requested
    assert await store.time_out() == []  # within the grace

    await clock.advance(LEASE)
    [failed] = await store.time_out()
    assert (failed["id"], failed["state"], failed["attempt"]) == (job["id"], "PENDING", 1)
    assert failed["last_error"]["type"] == "timeout"
    assert failed["lease_expires_at"] is None
    [*_, (name, data)] = await events(pool, job["id"])
    assert (name, data["reason"], data["error"]["type"]) == ("failed", "timeout", "timeout")
    # the lease is revoked: the stale worker's heartbeat and completion are refused
    with pytest.raises(LeaseLost):
        await store.heartbeat(job["id"], job["lease_token"])
    with pytest.raises(LeaseLost):
        await store.complete(job["id"], job["lease_token"], "late")
    assert (await store.get(unlimited["id"]))["state"] == "RUNNING"

    # the next attempt has the whole limit again, and its timeout uses up the last attempt
    await clock.advance(2)
    [again] = await store.claim(worker_id="w", queues=["tl"])
    assert again["attempt"] == 2
    assert not (await store.heartbeat(again["id"], again["lease_token"])).timeout_requested
    await clock.advance(LIMIT + LEASE)
    [dead] = await store.time_out()
    assert (dead["state"], dead["attempt"], dead["last_error"]["type"]) == ("DLQ", 2, "timeout")
    [*_, (name, data)] = await events(pool, job["id"])
    assert (name, data["reason"]) == ("dead_lettered", "timeout")


async def test_a_cancel_requested_wins_over_the_timeout(
    store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    job = await claimed(store, "tl", max_duration_seconds=LIMIT, lease_seconds=LEASE)
    await store.cancel(job["id"])
    await clock.advance(LIMIT + LEASE)
    [cancelled] = await store.time_out()
    assert cancelled["state"] == "CANCELLED"
    [*_, (name, data)] = await events(pool, job["id"])
    assert (name, data["reason"]) == ("cancelled", "cancel_requested")


async def test_the_running_sweeper_times_attempts_out_by_itself(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    job = await claimed(store, "tl", max_duration_seconds=1, lease_seconds=1, max_attempts=1)
    # the lease alone would not run out: the worker heartbeats (here, a long lease)
    await store.heartbeat(job["id"], job["lease_token"], lease_seconds=3600)
    running = await start_sweeper(Tuning(max_wait=0.05, min_wait=0.0))
    await until(
        lambda: running.metric("evora_sweeper_timed_out_total", outcome="dead_lettered") == 1,
        "the sweeper times the attempt out",
    )
    assert (await store.get(job["id"]))["state"] == "DLQ"
    assert await event_names(pool, job["id"]) == ["submitted", "claimed", "dead_lettered"]


async def _held(db_url: str) -> asyncpg.Connection:
    """A connection of its own, opened after the clock moved (it reads the offset when it
    connects), in a transaction the test ends."""
    conn = await asyncpg.connect(db_url)
    await conn.execute("BEGIN")
    return conn


async def test_a_completion_waiting_for_the_timeout_sweep_loses(
    store: JobStore, pool: asyncpg.Pool, clock: Clock, db_url: str
) -> None:
    job = await claimed(store, "tl", max_duration_seconds=LIMIT, lease_seconds=LEASE)
    await clock.advance(LIMIT + LEASE)
    sweep = await _held(db_url)
    try:
        assert len(await sweep.fetch(queries.TIME_OUT, 10, [])) == 1
        completion = asyncio.ensure_future(store.complete(job["id"], job["lease_token"], "ok"))
        await waits_for_a_lock(pool)  # it waits for the sweep's row lock
        assert not completion.done()
        await sweep.execute("COMMIT")
    finally:
        await sweep.close()
    with pytest.raises(LeaseLost):
        await completion
    assert (await store.get(job["id"]))["state"] == "PENDING"
    assert await event_names(pool, job["id"]) == ["submitted", "claimed", "failed"]


async def test_a_completion_holding_the_job_wins_over_the_timeout_sweep(
    store: JobStore, pool: asyncpg.Pool, clock: Clock, db_url: str
) -> None:
    job = await claimed(store, "tl", max_duration_seconds=LIMIT, lease_seconds=LEASE)
    await clock.advance(LIMIT + LEASE)
    completion = await _held(db_url)
    try:
        # the worker's own transaction completes it, within the grace's last moment
        await completion.execute(
            "SELECT evora.complete($1, $2, '\"ok\"')", job["id"], job["lease_token"]
        )
        assert await store.time_out() == []  # skipped, not waited for
        await completion.execute("COMMIT")
    finally:
        await completion.close()
    assert await store.time_out() == []
    assert (await store.get(job["id"]))["state"] == "COMPLETED"
    assert await event_names(pool, job["id"]) == ["submitted", "claimed", "completed"]


async def test_a_heartbeat_delays_the_timeout_sweep_but_never_saves_the_attempt(
    store: JobStore, pool: asyncpg.Pool, clock: Clock, db_url: str
) -> None:
    job = await claimed(store, "tl", max_duration_seconds=LIMIT, lease_seconds=LEASE)
    await clock.advance(LIMIT + LEASE)
    beat = await _held(db_url)
    try:
        [row] = await beat.fetch(queries.HEARTBEAT, job["id"], job["lease_token"], None, None)
        assert (row["outcome"], row["timeout_requested"]) == ("done", True)
        assert await store.time_out() == []  # the heartbeat holds the row: the next pass
        await beat.execute("COMMIT")
    finally:
        await beat.close()
    [failed] = await store.time_out()
    assert failed["state"] == "PENDING"

    # and a heartbeat waiting for the sweep finds the lease gone
    job = await claimed(store, "tl2", max_duration_seconds=LIMIT, lease_seconds=LEASE)
    await clock.advance(LIMIT + LEASE)
    sweep = await _held(db_url)
    try:
        assert len(await sweep.fetch(queries.TIME_OUT, 10, [])) == 1
        heartbeat = asyncio.ensure_future(store.heartbeat(job["id"], job["lease_token"]))
        await waits_for_a_lock(pool)
        assert not heartbeat.done()
        await sweep.execute("COMMIT")
    finally:
        await sweep.close()
    with pytest.raises(LeaseLost):
        await heartbeat


async def test_completion_racing_the_timeout_sweep_has_exactly_one_winner(
    store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    winners: Counter[str] = Counter()
    for n in range(ROUNDS):
        # one job due at a time: the sweep has no other to take instead
        job = await claimed(store, f"race-{n}", max_duration_seconds=LIMIT, lease_seconds=LEASE)
        await clock.advance(LIMIT + LEASE, partitions=False)
        sweep = store.time_out()
        complete = store.complete(job["id"], job["lease_token"], n)
        if n % 2:
            swept, completed = await asyncio.gather(sweep, complete, return_exceptions=True)
        else:
            completed, swept = await asyncio.gather(complete, sweep, return_exceptions=True)
        names = await event_names(pool, job["id"])
        if isinstance(completed, BaseException):
            assert isinstance(completed, LeaseLost), repr(completed)
            assert names == ["submitted", "claimed", "failed"], n
            assert [j["id"] for j in swept] == [job["id"]]  # type: ignore[union-attr]
            winners["timeout"] += 1
        else:
            assert names == ["submitted", "claimed", "completed"], n
            assert swept == []
            winners["completion"] += 1
    assert winners.total() == ROUNDS
    print(f"timeout/completion race winners: {dict(winners)}")
