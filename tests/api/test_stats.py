"""The read-model endpoints over HTTP, against a real projector's output in MongoDB."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest
from aiohttp.test_utils import TestServer
from pymongo.asynchronous.database import AsyncDatabase

from evora.config import Settings
from evora.protocol.jobs import JobSubmission
from evora.readmodels.layout import Document
from evora.sdk.client import Client
from evora.storage.jobs import JobStore
from evora_services.api.app import create_app
from evora_services.api.stats import encode_key
from evora_services.projector.projector import Projector
from tests.servers import api_with_read_models

ADMIN = {"Authorization": "Bearer test-admin-token"}
TOKENS = "admin:test-admin-token,producer:test-producer-token,worker:test-worker-token"


@pytest.fixture
async def api_url(db_url: str, mongo_url: str, mongo_db_name: str) -> AsyncIterator[str]:
    async with api_with_read_models(db_url, mongo_url, mongo_db_name, TOKENS) as url:
        yield url


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
    newest = await pool.fetchval("SELECT max(seq) FROM evora.job_events")
    async with aiohttp.ClientSession(headers=ADMIN) as http:
        async with http.get(api_url + "/v1/queues/mail/stats") as r:
            assert r.status == 200
            stats = await r.json()
        assert stats["queue"] == "mail" and stats["paused"] is True
        assert stats["counts"] == {
            "WAITING": 0,
            "PENDING": 1,
            "RUNNING": 1,
            "SUSPENDED": 0,
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


async def test_with_mongo_down_the_stats_endpoints_answer_503(db_url: str) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = Settings(database_url=db_url, tokens=TOKENS, mongo_url=f"mongodb://127.0.0.1:{port}")
    server = TestServer(await create_app(settings), host="127.0.0.1")
    await server.start_server()
    try:
        async with aiohttp.ClientSession(headers=ADMIN) as http:

            async def unavailable(path: str) -> None:
                async with http.get(server.make_url(path)) as r:
                    assert r.status == 503, (path, await r.text())
                    assert r.headers["Retry-After"]
                    assert (await r.json())["code"] == "unavailable"

            # At once: each waits out the MongoDB client's server selection (5 s).
            await asyncio.gather(
                *(unavailable(p) for p in ("/v1/queues", "/v1/queues/q/stats", "/v1/workers"))
            )
    finally:
        await server.close()


QUEUES = 130
WORKERS = 7
# A default page (50 queues) measured 21.6 KB; the whole list of 4,000 queues was 1.9 MB.
PAGE_BYTES_BOUND = 64 * 1024


async def pages(http: aiohttp.ClientSession, url: str, member: str) -> list[list[Any]]:
    """Every page of a list, following `next`."""
    found = []
    params: dict[str, str] = {}
    while True:
        async with http.get(url, params=params) as r:
            assert r.status == 200, await r.text()
            body = await r.json()
        found.append(body[member])
        if body["next"] is None:
            return found
        params["after"] = body["next"]


async def test_queues_and_workers_come_a_page_at_a_time(
    api_url: str, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    store = JobStore(pool)
    names = [f"q{i:03d}" for i in range(QUEUES)]
    await store.submit_batch([JobSubmission(queue=name, type="t") for name in names])
    for worker in range(WORKERS):
        await store.claim(worker_id=f"w-{worker}", queues=names[:20], max_jobs=1)
    projector = Projector(pool, mongo, 1)
    while await projector.run_once():
        pass
    async with aiohttp.ClientSession(headers=ADMIN) as http:
        async with http.get(api_url + "/v1/queues") as r:
            body = await r.read()
        first = orjson.loads(body)
        assert len(first["queues"]) == 50 and first["next"] is not None
        assert len(body) < PAGE_BYTES_BOUND, len(body)

        queue_pages = await pages(http, api_url + "/v1/queues?limit=60", "queues")
        assert [len(page) for page in queue_pages] == [60, 60, 10]
        assert [q["queue"] for page in queue_pages for q in page] == names

        worker_pages = await pages(http, api_url + "/v1/workers?limit=3", "workers")
        assert [len(page) for page in worker_pages] == [3, 3, 1]
        listed = [(w["last_seen"], w["worker_id"]) for page in worker_pages for w in page]
        assert {worker for _, worker in listed} == {f"w-{i}" for i in range(WORKERS)}
        assert [seen for seen, _ in listed] == sorted((seen for seen, _ in listed), reverse=True)
        async with http.get(api_url + "/v1/workers") as r:
            assert len((await r.json())["workers"]) == WORKERS

        for path, query in [
            ("/v1/queues", "limit=0"),
            ("/v1/queues", "limit=501"),
            ("/v1/queues", "limit=many"),
            ("/v1/queues", "after=not-a-cursor"),
            ("/v1/queues", f"after={encode_key(['_not a queue'])}"),
            ("/v1/queues", f"after={encode_key(['q001', 'q002'])}"),
            ("/v1/queues", "page=2"),
            ("/v1/workers", f"after={encode_key(['q001'])}"),
            ("/v1/workers", f"after={encode_key(['yesterday', 'w-1'])}"),
            ("/v1/workers", f"after={encode_key(['2026-01-01T00:00:00', 'w-1'])}"),
        ]:
            async with http.get(f"{api_url}{path}?{query}") as r:
                assert r.status == 422, (path, query, r.status)
                assert r.content_type == "application/problem+json"
                assert (await r.json())["code"] == "validation_error"

    async with Client(api_url, "test-admin-token") as client:
        assert [q["queue"] for q in await client.queues()] == names
