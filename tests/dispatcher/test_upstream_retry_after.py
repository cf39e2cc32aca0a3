"""Limits that learn from upstream (docs/flow-control.md, "Upstream retry-after"): a worker
that got a rate-limit answer reports it with its failure (`retry_after: {limit_key,
seconds}`) over HTTP, in a batch of acks or in SQL (evora.fail). The key's bucket is drained
until then for every dispatcher, the job runs again then without using up an attempt, and a
claim never waits for a drain that is still uncommitted."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from evora.protocol.bounds import MAX_RETRY_AFTER_SECONDS
from evora.storage.jobs import JobStore
from evora.storage.limits import LimitSpec, LimitStore, Rate
from tests.conftest import Clock
from tests.dispatcher.conftest import Dispatcher
from tests.dispatcher.test_worker_api import claim, submit

KEY = "api:github"
ERROR = {"message": "429 Too Many Requests", "type": "HTTPError"}

Body = dict[str, Any]  # a job as the dispatcher answers it, or a retry_after
Report = Callable[[Dispatcher, asyncpg.Pool, Body, Body], Awaitable[str]]


async def _http(d: Dispatcher, pool: asyncpg.Pool, job: Body, after: Body) -> str:
    status, answer = await d.post(
        f"/v1/jobs/{job['id']}/fail",
        {"lease_token": str(job["lease_token"]), "error": ERROR, "retry_after": after},
    )
    assert status == 200, answer
    return str(answer["state"])


async def _acks(d: Dispatcher, pool: asyncpg.Pool, job: Body, after: Body) -> str:
    ack = {
        "id": str(job["id"]),
        "lease_token": str(job["lease_token"]),
        "outcome": "fail",
        "error": ERROR,
        "retry_after": after,
    }
    status, answer = await d.post("/v1/acks", {"acks": [ack]})
    assert (status, answer["results"][0]["status"]) == (200, 200), answer
    return str(await pool.fetchval("SELECT state FROM evora.jobs WHERE id = $1", job["id"]))


async def _sql(d: Dispatcher, pool: asyncpg.Pool, job: Body, after: Body) -> str:
    async with pool.acquire() as conn, conn.transaction():
        return str(
            await conn.fetchval(
                "SELECT evora.fail($1, $2, $3::jsonb, retry_after => $4::jsonb)",
                job["id"],
                job["lease_token"],
                ERROR,
                after,
            )
        )


@pytest.mark.parametrize("report", [_http, _acks, _sql], ids=["http", "acks", "sql"])
@pytest.mark.parametrize(
    "spec",
    [LimitSpec(concurrency=10, rate=None), LimitSpec(concurrency=None, rate=Rate(100, 1.0))],
    ids=["concurrency", "rate"],
)
async def test_the_key_is_drained_for_every_dispatcher_and_the_attempt_handed_back(
    dispatcher: Dispatcher,
    store: JobStore,
    pool: asyncpg.Pool,
    pg_server_url: str,
    db_url: str,
    report: Report,
    spec: LimitSpec,
) -> None:
    clock = Clock(pg_server_url, db_url, [pool, dispatcher.state.store._pool])
    await LimitStore(pool).put(KEY, spec)
    ids = [await submit(store, limit_keys=[KEY], max_attempts=1) for _ in range(3)]
    # another key's job, in the same queue: not held back
    free = await submit(store, limit_keys=["api:other"])
    [job] = await claim(dispatcher, max_jobs=1)
    assert job["id"] == ids[0]

    assert await report(dispatcher, pool, job, {"limit_key": KEY, "seconds": 60}) == "PENDING"
    failed = await store.get(job["id"])
    # not a counted attempt: max_attempts=1, and the job is not dead-lettered
    assert (failed["state"], failed["attempt"], failed["last_error"]["message"]) == (
        "PENDING",
        0,
        ERROR["message"],
    )
    [*_, event] = await store.events(job["id"])
    assert (event["event"], event["data"]["reason"]) == ("released", "throttled_upstream")

    # Neither this dispatcher nor another (the store's own pool) starts a job holding the key
    # before the upstream's time, though two are due; the other key's job is not held back.
    assert [j["id"] for j in await claim(dispatcher, max_jobs=10)] == [free]
    assert await store.claim(worker_id="w2", queues=["q"], max_jobs=10) == []
    usage = await LimitStore(pool).usage(KEY)
    assert usage["throttled_until"] is not None
    assert usage["throttled_jobs"] == 2
    await clock.advance(30)
    assert await store.claim(worker_id="w2", queues=["q"], max_jobs=10) == []

    await clock.advance(31)
    claimed = await store.claim(worker_id="w2", queues=["q"], max_jobs=10)
    assert sorted(str(j["id"]) for j in claimed) == sorted(ids)
    again = next(j for j in claimed if str(j["id"]) == ids[0])
    assert again["attempt"] == 1
    assert (await LimitStore(pool).usage(KEY))["throttled_until"] is None


async def test_a_claim_never_waits_for_an_uncommitted_drain(
    dispatcher: Dispatcher, store: JobStore, pool: asyncpg.Pool
) -> None:
    """A worker's transaction reports a retry-after for a key no claim has used yet (so the
    drain makes its bucket row) and stays open: a claim of a job holding that key meanwhile
    skips it at once, as it skips any key another claim holds, instead of waiting for the
    worker's commit; once committed, the drain holds."""
    await LimitStore(pool).put("api:*", LimitSpec(concurrency=10, rate=None))
    failing = await submit(store, limit_keys=["api:a"])
    other = await submit(store, limit_keys=["api:b"])
    [job] = await claim(dispatcher, max_jobs=1)
    assert job["id"] == failing
    assert await pool.fetchval("SELECT count(*) FROM evora.flow_buckets WHERE key = 'api:b'") == 0

    worker = await pool.acquire()
    try:
        held = worker.transaction()
        await held.start()
        assert (
            await worker.fetchval(
                "SELECT evora.fail($1, $2, $3::jsonb, retry_after => $4::jsonb)",
                job["id"],
                job["lease_token"],
                ERROR,
                {"limit_key": "api:b", "seconds": 60},
            )
            == "PENDING"
        )
        # the dispatcher's claim answers at once, without the key's job
        assert await asyncio.wait_for(claim(dispatcher, max_jobs=10), 5) == []
        await held.commit()
    finally:
        await pool.release(worker)
    assert await claim(dispatcher, max_jobs=10) == []
    assert (await store.get(UUID(other)))["state"] == "PENDING"


@pytest.mark.parametrize(
    "after",
    [
        {"limit_key": KEY, "seconds": 0},
        {"limit_key": KEY, "seconds": MAX_RETRY_AFTER_SECONDS + 1},
        {"limit_key": "not a key", "seconds": 1},
        {"seconds": 1},
        {"limit_key": KEY, "seconds": 1, "extra": 1},
    ],
)
async def test_a_retry_after_within_bounds(
    dispatcher: Dispatcher, store: JobStore, pool: asyncpg.Pool, after: dict[str, Any]
) -> None:
    job_id = await submit(store, limit_keys=[KEY])
    [job] = await claim(dispatcher)
    body = {"lease_token": job["lease_token"], "error": ERROR, "retry_after": after}
    status, problem = await dispatcher.post(f"/v1/jobs/{job_id}/fail", body)
    assert status == 422, problem
    with pytest.raises(asyncpg.PostgresError) as refused:
        await _sql(dispatcher, pool, job, after)
    # a field missing is a NULL where one is required (23502), as in evora.submit()
    assert refused.value.sqlstate == ("23502" if "limit_key" not in after else "22023")
    assert (await store.get(job["id"]))["state"] == "RUNNING"


@pytest.mark.parametrize(
    "extra", [{"retry_in_seconds": 5}, {"error": {**ERROR, "retryable": False}}]
)
async def test_a_retry_after_is_the_retry(
    dispatcher: Dispatcher, store: JobStore, pool: asyncpg.Pool, extra: dict[str, Any]
) -> None:
    job_id = await submit(store, limit_keys=[KEY])
    [job] = await claim(dispatcher)
    body = {
        "lease_token": job["lease_token"],
        "error": ERROR,
        "retry_after": {"limit_key": KEY, "seconds": 5},
        **extra,
    }
    status, problem = await dispatcher.post(f"/v1/jobs/{job_id}/fail", body)
    assert status == 422, problem
    with pytest.raises(asyncpg.PostgresError) as refused:
        async with pool.acquire() as conn:
            await conn.fetchval(
                "SELECT evora.fail($1, $2, $3::jsonb, $4, $5, $6::jsonb)",
                job["id"],
                job["lease_token"],
                body["error"],
                body["error"].get("retryable", True),
                body.get("retry_in_seconds"),
                body["retry_after"],
            )
    assert refused.value.sqlstate == "22023"
    assert (await store.get(job["id"]))["state"] == "RUNNING"
