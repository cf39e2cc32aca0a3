"""Callbacks under races (docs/callbacks.md): every change of a callback is made under its
job's row lock, and the resolution reads the callback again once it holds it. Each test holds
one side's transaction open at the unlucky moment, so the other waits for it and must answer
consistently with what it committed: exactly one of a resolution and a timeout (or a cancel)
wins, and a second resolution answers the first."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from evora.domain.errors import CallbackSettled, LeaseLost
from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.rows import JobDict
from tests.conftest import Clock
from tests.polling import waits_for_a_lock


async def suspended(
    store: JobStore, *, queue: str = "q", on_timeout: str = "resume", count: int = 1
) -> list[tuple[JobDict, str]]:
    """Jobs claimed and suspended on callbacks that time out in 60 s: each with its id."""
    await store.submit_batch([JobSubmission(queue=queue, type="t") for _ in range(count)])
    waiting = []
    for job in await store.claim(worker_id="w", queues=[queue], max_jobs=count):
        s = await store.suspend(
            job["id"], job["lease_token"], timeout_seconds=60, on_timeout=on_timeout
        )
        assert s.callback_id is not None
        waiting.append((job, s.callback_id))
    return waiting


@pytest.fixture
async def early(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection opened before the test moves the clock: its statements run at a time
    before the callback's timeout (a resolution that began in time)."""
    pool = await create_pool(db_url, min_size=1, max_size=1)
    try:
        async with pool.acquire() as conn:
            yield conn
    finally:
        await pool.close()


async def resolve_on(conn: asyncpg.Connection, callback_id: str, payload: Any) -> asyncpg.Record:
    row: asyncpg.Record = await conn.fetchrow(
        queries.RESOLVE_CALLBACK, callback_id, None, payload, []
    )
    return row


async def test_a_resolution_that_waited_for_the_timeouts_sweep_is_refused(
    store: JobStore, pool: asyncpg.Pool, clock: Clock, early: asyncpg.Connection
) -> None:
    """Begun before the timeout, the resolution finds the callback open in its snapshot; the
    sweep, past the timeout, settles it meanwhile and commits while the resolution waits for
    the job: the resolution reads the callback again and answers timed_out, changing
    nothing."""
    [(job, callback_id)] = await suspended(store)
    await clock.advance(61)
    async with pool.acquire() as sweeper:
        transaction = sweeper.transaction()
        await transaction.start()
        assert len(await sweeper.fetch(queries.EXPIRE_CALLBACKS, 100, [])) == 1
        answer = asyncio.create_task(resolve_on(early, callback_id, "late"))
        await waits_for_a_lock(pool)
        await transaction.commit()
    assert (await answer)["outcome"] == "timed_out"
    now = await store.get(job["id"])
    assert (now["state"], now["attempt"], now["callback"]["timed_out"]) == ("PENDING", 0, True)
    assert now["callback"]["payload"] is None
    events = [e["event"] for e in await store.events(job["id"])]
    assert events == ["submitted", "claimed", "suspended", "resumed"]


async def test_a_sweep_passes_over_a_resolution_in_flight(
    store: JobStore, pool: asyncpg.Pool, clock: Clock, early: asyncpg.Connection
) -> None:
    """The resolution (in time) holds the job when the timeout's sweep runs: the sweep skips
    it, and once the resolution committed there is nothing left to time out."""
    [(job, callback_id)] = await suspended(store)
    transaction = early.transaction()
    await transaction.start()
    assert (await resolve_on(early, callback_id, "in time"))["outcome"] == "done"
    await clock.advance(61)
    assert await store.expire_callbacks() == []
    await transaction.commit()
    assert await store.expire_callbacks() == []
    now = await store.get(job["id"])
    assert (now["state"], now["callback"]["payload"]) == ("PENDING", "in time")
    assert not now["callback"]["timed_out"]
    # and past the timeout, the sender's repeat still answers its own resolution
    assert (await store.resolve_callback(callback_id, "again"))["payload"] == "in time"


async def test_a_resolution_that_waited_for_a_cancel_is_refused(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    [(job, callback_id)] = await suspended(store)
    async with pool.acquire() as other:
        transaction = other.transaction()
        await transaction.start()
        [cancelled] = await other.fetch(queries.CANCEL, job["id"], [])
        assert cancelled["outcome"] == "done"
        answer = asyncio.create_task(store.resolve_callback(callback_id, "approved"))
        await waits_for_a_lock(pool)
        await transaction.commit()
    with pytest.raises(CallbackSettled, match="cancelled"):
        await answer
    assert (await store.get(job["id"]))["state"] == "CANCELLED"
    assert await pool.fetchval("SELECT outcome FROM evora.callbacks") == "cancelled"


async def test_a_cancel_that_waited_for_a_resolution_cancels_the_resumed_job(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """The resolution committed first: it answered done, and the cancel that waited for it
    finds the job PENDING and cancels it; the callback stays resolved."""
    [(job, callback_id)] = await suspended(store)
    async with pool.acquire() as other:
        transaction = other.transaction()
        await transaction.start()
        assert (await resolve_on(other, callback_id, "approved"))["outcome"] == "done"
        answer = asyncio.create_task(store.cancel(job["id"]))
        await waits_for_a_lock(pool)
        await transaction.commit()
    cancelled = await answer
    assert cancelled.immediate and cancelled.job["state"] == "CANCELLED"
    assert await pool.fetchval("SELECT outcome FROM evora.callbacks") == "resolved"
    events = [e["event"] for e in await store.events(job["id"])]
    assert events[-2:] == ["resumed", "cancelled"]


async def test_a_second_resolution_answers_the_first(store: JobStore, pool: asyncpg.Pool) -> None:
    [(job, callback_id)] = await suspended(store)
    async with pool.acquire() as other:
        transaction = other.transaction()
        await transaction.start()
        first = await resolve_on(other, callback_id, "first")
        assert first["outcome"] == "done"
        second = asyncio.create_task(store.resolve_callback(callback_id, "second"))
        await waits_for_a_lock(pool)
        await transaction.commit()
    assert await second == first["resolution"]
    assert (await store.get(job["id"]))["callback"]["payload"] == "first"


async def test_concurrent_resolutions_agree(store: JobStore) -> None:
    """Autocommit statements only, all at once: one resolves, every other replays it."""
    waiting = await suspended(store, count=5)
    for job, callback_id in waiting:
        answers = await asyncio.gather(*(store.resolve_callback(callback_id, n) for n in range(8)))
        assert all(a == answers[0] for a in answers)
        events = [e["event"] for e in await store.events(job["id"])]
        assert events.count("resumed") == 1
        assert (await store.get(job["id"]))["callback"]["payload"] == answers[0]["payload"]


async def test_a_suspend_that_waited_for_its_leases_expiry_is_refused(
    store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    await store.submit(JobSubmission(queue="q", type="t", lease_seconds=30))
    [job] = await store.claim(worker_id="w", queues=["q"])
    await clock.advance(31)
    async with pool.acquire() as sweeper:
        transaction = sweeper.transaction()
        await transaction.start()
        assert len(await sweeper.fetch(queries.EXPIRE_LEASES, 100, [])) == 1
        answer = asyncio.create_task(
            store.suspend(job["id"], job["lease_token"], timeout_seconds=60, on_timeout="fail")
        )
        await waits_for_a_lock(pool)
        await transaction.commit()
    with pytest.raises(LeaseLost):
        await answer
    assert (await store.get(job["id"]))["state"] == "PENDING"
    assert await pool.fetchval("SELECT count(*) FROM evora.callbacks") == 0


async def test_suspends_racing_lease_expiry_each_win_or_lose_whole(
    store: JobStore, clock: Clock
) -> None:
    """Autocommit statements only: every job ends either SUSPENDED on one callback (the
    suspend won) or expired (the sweep won, the suspend refused), never both."""
    count = 20
    await store.submit_batch(
        [JobSubmission(queue="q", type="t", lease_seconds=30) for _ in range(count)]
    )
    jobs = await store.claim(worker_id="w", queues=["q"], max_jobs=count)
    await clock.advance(31)

    async def suspend(job: JobDict) -> bool:
        try:
            await store.suspend(
                job["id"], job["lease_token"], timeout_seconds=60, on_timeout="fail"
            )
        except LeaseLost:
            return False
        return True

    sweep = asyncio.create_task(store.expire_leases())
    won = await asyncio.gather(*(suspend(j) for j in jobs))
    expired = await sweep
    expired_ids = {j["id"] for j in expired}
    for job, suspended_it in zip(jobs, won, strict=True):
        state = (await store.get(job["id"]))["state"]
        assert (state, job["id"] in expired_ids) == (
            ("SUSPENDED", False) if suspended_it else ("PENDING", True)
        )


async def test_resolving_in_sql_follows_the_http_rules(store: JobStore, pool: asyncpg.Pool) -> None:
    """evora.resolve_callback() runs what the HTTP resolve runs: the first resolution, then
    the same answer; EV404 for an unknown callback, EV409 once its job was cancelled."""
    (first, first_id), (second, second_id) = await suspended(store, count=2)
    resolved = await pool.fetchval(
        "SELECT evora.resolve_callback($1, $2)", first_id, {"approved": True}
    )
    assert resolved == await store.resolve_callback(first_id, "ignored")
    assert resolved["payload"] == {"approved": True}
    again = await pool.fetchval("SELECT evora.resolve_callback($1)", first_id)
    assert again == resolved
    assert (await store.get(first["id"]))["state"] == "PENDING"
    with pytest.raises(asyncpg.PostgresError) as unknown:
        await pool.fetchval("SELECT evora.resolve_callback($1)", "evcb_" + "0" * 64)
    assert unknown.value.sqlstate == "EV404"
    await store.cancel(second["id"])
    with pytest.raises(asyncpg.PostgresError) as settled:
        await pool.fetchval("SELECT evora.resolve_callback($1, 'null')", second_id)
    assert settled.value.sqlstate == "EV409"
