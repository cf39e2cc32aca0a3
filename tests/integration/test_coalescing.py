"""Coalesced requests wait on their own locks only (jobs.coalescing): a statement for several
requests gives up a lock held outside, is split, and the one item that needs the lock waits
for it alone, out of line. These drive the store's coalescers directly, so the batch is
exactly what each test says (the HTTP tests in tests/api/test_coalesced_submissions.py and
tests/dispatcher/test_coalesced_acks.py race real requests)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import orjson
import pytest
from asyncpg.connection import LoggedQuery

from evora.domain.errors import EvoraError
from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.jobs import AckOutcome, AckResult, Completion, Failure, JobStore, coalescing
from evora.storage.submissions import Submitted
from evora_services.api.tracing import traced_submitter
from tests.integration.conftest import own_store
from tests.polling import until

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


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


@pytest.fixture(params=[True, False], ids=["generic_plans", "auto_plans"])
async def planned_store(request: pytest.FixtureRequest, db_url: str) -> AsyncIterator[JobStore]:
    """A store whose pool plans every statement generically (as the dispatcher's does) or as
    PostgreSQL chooses: the brief lock timeout must be in force before the statement takes
    any lock under either plan."""
    async with own_store(db_url, max_size=8, generic_plans=request.param) as store:
        yield store


async def test_a_coalesced_failure_of_a_held_job_waits_alone(
    planned_store: JobStore, app_conn: asyncpg.Connection
) -> None:
    store = planned_store
    await store.submit_batch([JobSubmission(queue="q", type="t") for _ in range(6)])
    parent, *others = await store.claim(worker_id="w", queues=["q"], max_jobs=6)
    failures = coalescing(store.fail_many)
    # more flushes than PostgreSQL's five custom plans before it may settle on a generic one
    for job in others:
        await failures.submit(Failure(job["id"], uuid.uuid4(), "not its lease"))
    async with app_conn.transaction():
        await app_conn.fetchval(
            "SELECT evora.submit('later', 't', '{}', $1::jsonb)",
            orjson.dumps({"depends_on": [str(parent["id"])]}).decode(),
        )
        contended = asyncio.create_task(
            failures.submit(Failure(parent["id"], parent["lease_token"], "boom", retryable=False))
        )
        beside = [
            asyncio.create_task(
                failures.submit(Failure(job["id"], job["lease_token"], "boom", retryable=False))
            )
            for job in others
        ]
        answered: list[AckOutcome] = await asyncio.gather(*beside)
        assert [a.result for a in answered] == [AckResult.DONE] * 5
        await until(lambda: waiting_on_a_lock(store.pool), "the parent's failure waits alone")
        assert not contended.done()
    outcome = await contended
    assert outcome.job_or_raise()["state"] == "DLQ"
    await failures.close()


async def test_a_coalesced_traced_submission_of_a_held_key_waits_alone(
    planned_store: JobStore, app_conn: asyncpg.Connection
) -> None:
    store = planned_store
    submissions = coalescing(traced_submitter(store))
    for i in range(6):  # past the five custom plans, as above
        await submissions.submit((JobSubmission(queue="warm", type="t", payload=i), None))
    held = app_conn.transaction()
    await held.start()
    await app_conn.fetchval("SELECT evora.submit('q', 't', '1', '{\"idempotency_key\": \"K\"}')")
    contended = asyncio.create_task(
        submissions.submit(
            (JobSubmission(queue="q", type="t", payload=2, idempotency_key="K"), TRACEPARENT)
        )
    )
    beside = [
        asyncio.create_task(
            submissions.submit((JobSubmission(queue="q", type="t", payload=i), TRACEPARENT))
        )
        for i in range(5)
    ]
    answered: list[Submitted | EvoraError] = await asyncio.gather(*beside)
    assert all(isinstance(a, Submitted) and a.created for a in answered)
    await until(lambda: waiting_on_a_lock(store.pool), "K's submission waits alone")
    assert not contended.done()
    await held.rollback()
    outcome = await contended
    assert isinstance(outcome, Submitted) and outcome.created
    ids = [a.id for a in answered if isinstance(a, Submitted)] + [outcome.id]
    assert await store.traceparents(ids) == {job_id: TRACEPARENT for job_id in ids}
    await submissions.close()


@pytest.fixture
async def sent() -> list[str]:
    return []


@pytest.fixture
async def one_connection_store(db_url: str, sent: list[str]) -> AsyncIterator[JobStore]:
    """A store on one connection that records every statement it sends for requests, each a
    round trip (BEGIN, SET and COMMIT too); not the trailing hints the store sends on its own
    time (notify.py), whichever request's turn they take."""

    def log(record: LoggedQuery) -> None:
        if record.query != queries.NOTIFY_QUEUES:
            sent.append(record.query)

    async with own_store(db_url, max_size=1, log=log) as store:
        yield store


async def test_a_lone_request_is_one_statement_outside_a_transaction_block(
    one_connection_store: JobStore, sent: list[str]
) -> None:
    store = one_connection_store
    await store.submit_batch([JobSubmission(queue="q", type="t") for _ in range(4)])
    jobs = await store.claim(worker_id="w", queues=["q"], max_jobs=4)
    submissions = coalescing(store.submit_each)
    completions = coalescing(store.complete_many)
    failures = coalescing(store.fail_many)
    # asyncpg prepares a statement (and learns its types) the first time it sends it
    await submissions.submit(JobSubmission(queue="q", type="t"))
    await completions.submit(Completion(jobs[0]["id"], jobs[0]["lease_token"]))
    await failures.submit(Failure(jobs[1]["id"], jobs[1]["lease_token"], "boom"))
    lone: list[Callable[[], Awaitable[object]]] = [
        lambda: submissions.submit(JobSubmission(queue="q", type="t")),
        lambda: completions.submit(Completion(jobs[2]["id"], jobs[2]["lease_token"])),
        lambda: failures.submit(Failure(jobs[3]["id"], jobs[3]["lease_token"], "boom")),
    ]
    for request in lone:
        sent.clear()
        await request()
        assert len(sent) == 1, sent
    async with store.pool.acquire() as conn:
        # the brief lock timeout ended with its statement, not with the pooled connection
        assert await conn.fetchval("SHOW lock_timeout") == "0"
    for coalescer in (submissions, completions, failures):
        await coalescer.close()
