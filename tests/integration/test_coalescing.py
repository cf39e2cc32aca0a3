"""Coalesced requests wait on their own locks only (jobs.coalescing): a statement for several
requests gives up a lock held outside, is split, and the one item that needs the lock waits
for it alone, out of line. These drive the store's coalescers directly, so the batch is
exactly what each test says (the HTTP tests in tests/api/test_coalesced_submissions.py and
tests/dispatcher/test_coalesced_acks.py race real requests)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import orjson
import pytest

from evora.domain.errors import EvoraError
from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import AckOutcome, AckResult, Completion, JobStore, coalescing
from evora.storage.submissions import Submitted
from tests.polling import until


@pytest.fixture
async def app_conn(db_url: str) -> AsyncIterator[asyncpg.Connection]:
    """An application's own connection, whose transaction the test holds open."""
    conn = await asyncpg.connect(db_url)
    try:
        yield conn
    finally:
        await conn.close()


async def waiting_on_a_lock(pool: asyncpg.Pool) -> bool:
    waiting: int = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database()"
    )
    return waiting > 0


async def test_a_coalesced_ack_of_a_held_job_waits_alone(
    store: JobStore, pool: asyncpg.Pool, app_conn: asyncpg.Connection
) -> None:
    await store.submit_batch([JobSubmission(queue="q", type="t") for _ in range(6)])
    parent, *others = await store.claim(worker_id="w", queues=["q"], max_jobs=6)
    completions = coalescing(store.complete_many)
    async with app_conn.transaction():
        await app_conn.fetchval(
            "SELECT evora.submit('later', 't', '{}', $1::jsonb)",
            orjson.dumps({"depends_on": [str(parent["id"])]}).decode(),
        )
        # All in one turn of the event loop: one statement, which needs the held row.
        contended = asyncio.create_task(
            completions.submit(Completion(parent["id"], parent["lease_token"]))
        )
        beside = [
            asyncio.create_task(completions.submit(Completion(job["id"], job["lease_token"])))
            for job in others
        ]
        answered: list[AckOutcome] = await asyncio.gather(*beside)
        assert [a.result for a in answered] == [AckResult.DONE] * 5
        await until(lambda: waiting_on_a_lock(pool), "the parent's ack waits alone")
        assert not contended.done()
    outcome = await contended
    assert outcome.result is AckResult.DONE
    assert outcome.job_or_raise()["state"] == "COMPLETED"
    await completions.close()


async def test_a_coalesced_submission_of_a_held_key_waits_alone(
    store: JobStore, pool: asyncpg.Pool, app_conn: asyncpg.Connection
) -> None:
    submissions = coalescing(store.submit_each)
    held = app_conn.transaction()
    await held.start()
    await app_conn.fetchval("SELECT evora.submit('q', 't', '1', '{\"idempotency_key\": \"K\"}')")
    contended = asyncio.create_task(
        submissions.submit(JobSubmission(queue="q", type="t", payload=2, idempotency_key="K"))
    )
    beside = [
        asyncio.create_task(submissions.submit(JobSubmission(queue="q", type="t", payload=i)))
        for i in range(5)
    ]
    answered: list[Submitted | EvoraError] = await asyncio.gather(*beside)
    assert all(isinstance(a, Submitted) and a.created for a in answered)
    await until(lambda: waiting_on_a_lock(pool), "K's submission waits alone")
    assert not contended.done()
    # Rolled back, the key is free: the waiting submission creates its job; committed with
    # other fields, it would be a conflict.
    await held.rollback()
    outcome = await contended
    assert isinstance(outcome, Submitted) and outcome.created
    assert await pool.fetchval("SELECT count(*) FROM evora.jobs") == 6
    await submissions.close()
