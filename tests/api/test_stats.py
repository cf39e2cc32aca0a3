"""The read-model endpoints over HTTP, against a real projector's output in MongoDB."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestServer
from pymongo.asynchronous.database import AsyncDatabase

from evora.config import Settings
from evora.domain.models import JobSubmission
from evora.readmodels.layout import Document
from evora.storage.jobs import JobStore
from services.api.app import create_app
from services.projector.projector import Projector

ADMIN = {"Authorization": "Bearer test-admin-token"}
TOKENS = "admin:test-admin-token,producer:test-producer-token,worker:test-worker-token"


@pytest.fixture
async def api_url(db_url: str, mongo_url: str, mongo_db_name: str) -> AsyncIterator[str]:
    settings = Settings(
        database_url=db_url, mongo_url=mongo_url, mongo_db=mongo_db_name, tokens=TOKENS
    )
    server = TestServer(await create_app(settings), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_stats_workers_and_queues(
    api_url: str, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    store = JobStore(pool)
    await store.submit_batch([JobSubmission(queue="mail", type="send") for _ in range(3)])
    [job, *_] = await store.claim(worker_id="w-1", queues=["mail"], max_jobs=2)
    await store.complete(job["id"], job["lease_token"])
    await store.pause("mail")
    projector = Projector(pool, mongo, 1)
    while await projector.run_once():
        pass
    await projector.refresh()  # oldest pending comes from PostgreSQL, not from events
    newest = await pool.fetchval("SELECT max(seq) FROM job_events")
    async with aiohttp.ClientSession(headers=ADMIN) as http:
        async with http.get(api_url + "/v1/queues/mail/stats") as r:
            assert r.status == 200
            stats = await r.json()
        assert stats["queue"] == "mail" and stats["paused"] is True
        assert stats["counts"] == {
            "PENDING": 1,
            "RUNNING": 1,
            "COMPLETED": 1,
            "DLQ": 0,
            "CANCELLED": 0,
        }
        assert stats["totals"] == {
            "submitted": 3,
            "completed": 1,
            "failed": 0,
            "dead_lettered": 0,
            "retried": 0,
            "lease_expired": 0,
        }
        assert stats["as_of"]["seq"] == newest
        assert set(stats["throughput"]["completed_per_minute"]) == {"1m", "5m", "15m"}
        assert stats["oldest_pending_at"] is not None
        async with http.get(api_url + "/v1/queues/nowhere/stats") as r:
            problem = await r.json()
            assert r.status == 404 and problem["code"] == "queue_not_found"
        async with http.get(api_url + "/v1/queues") as r:
            assert [q["queue"] for q in (await r.json())["queues"]] == ["mail"]
        async with http.get(api_url + "/v1/workers") as r:
            [worker] = (await r.json())["workers"]
        assert worker["worker_id"] == "w-1" and worker["claimed"] == 2
        assert worker["completed"] == 1 and worker["running"] == 1
        async with http.get(
            api_url + "/v1/queues/mail/stats",
            headers={"Authorization": "Bearer test-producer-token"},
        ) as r:
            assert r.status == 403


async def test_without_mongo_the_stats_endpoints_answer_503(db_url: str) -> None:
    server = TestServer(
        await create_app(Settings(database_url=db_url, tokens=TOKENS)), host="127.0.0.1"
    )
    await server.start_server()
    try:
        async with aiohttp.ClientSession(headers=ADMIN) as http:
            async with http.get(server.make_url("/v1/queues")) as r:
                assert r.status == 503
                assert (await r.json())["code"] == "read_models_unavailable"
            async with http.get(server.make_url("/readyz")) as r:
                assert r.status == 200
    finally:
        await server.close()
