"""Every use of the database by a request has a deadline: with the `jobs` table locked by
another session, requests are answered 503 `unavailable` with Retry-After once it passes,
instead of waiting as long as the lock is held; long-poll claims still wait their whole
`wait_seconds`, since that wait is not a database wait."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest

from evora.config import Settings
from evora.http.app import DATABASE_BUDGET
from evora_services.api.app import create_app as create_api
from evora_services.dispatcher.app import create_app as create_dispatcher
from tests.e2e.conftest import WORKER_HEADERS
from tests.servers import PRODUCER_TOKEN, TOKENS, Service, serve

BUDGET_S = 1.0
# Generous for a loaded machine, yet far below the lock, which is held for a minute.
ANSWERED_WITHIN_S = 8.0
PRODUCER = {"Authorization": f"Bearer {PRODUCER_TOKEN}"}


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


@pytest.fixture
async def services(db_url: str) -> AsyncIterator[tuple[Service, Service]]:
    settings = Settings(database_url=db_url, tokens=TOKENS)
    api_app = await create_api(settings)
    dispatcher_app = await create_dispatcher(settings)
    for app in (api_app, dispatcher_app):
        app[DATABASE_BUDGET] = BUDGET_S
    api = await serve(api_app, "api")
    dispatcher = await serve(dispatcher_app, "dispatcher", handler_cancellation=True)
    try:
        yield api, dispatcher
    finally:
        await dispatcher.close()
        await api.close()


@pytest.fixture
def locked_jobs(plain_conn: asyncpg.Connection) -> asyncpg.Connection:
    """A session that holds the `jobs` table locked until the test ends."""
    return plain_conn


async def lock_jobs(conn: asyncpg.Connection) -> None:
    await conn.execute("SET lock_timeout = 0")
    await conn.execute("BEGIN")
    await conn.execute("LOCK TABLE evora.jobs IN ACCESS EXCLUSIVE MODE")


async def call(
    http: aiohttp.ClientSession, method: str, url: str, body: Any, headers: dict[str, str]
) -> tuple[int, dict[str, Any], float, str | None]:
    started = time.monotonic()
    async with http.request(method, url, json=body, headers=headers) as response:
        answer = await response.json(content_type=None)
        return (
            response.status,
            answer,
            time.monotonic() - started,
            response.headers.get("Retry-After"),
        )


async def test_requests_get_503_once_their_database_deadline_passes(
    services: tuple[Service, Service], locked_jobs: asyncpg.Connection, http: aiohttp.ClientSession
) -> None:
    api, dispatcher = services
    job = {"queue": "dl", "type": "t"}
    status, submitted, _, _ = await call(http, "POST", f"{api.url}/v1/jobs", job, PRODUCER)
    assert status == 201
    token = str(uuid.uuid4())
    await lock_jobs(locked_jobs)

    requests = [
        ("GET", f"{api.url}/v1/jobs/{submitted['id']}", None, PRODUCER),
        ("POST", f"{api.url}/v1/jobs", job, PRODUCER),  # coalesced with others
        ("POST", f"{api.url}/v1/jobs/batch", {"jobs": [job, job]}, PRODUCER),
        (
            "POST",
            f"{dispatcher.url}/v1/jobs/{submitted['id']}/complete",  # coalesced too
            {"lease_token": token},
            WORKER_HEADERS,
        ),
        (
            "POST",
            f"{dispatcher.url}/v1/acks",
            {"acks": [{"id": submitted["id"], "lease_token": token, "outcome": "complete"}]},
            WORKER_HEADERS,
        ),
    ]
    for method, url, body, headers in requests:
        status, answer, seconds, retry_after = await call(http, method, url, body, headers)
        print(f"{method} {url.split('/', 3)[3]}: {status} after {seconds:.1f}s")
        assert status == 503, answer
        assert answer["code"] == "unavailable"
        assert retry_after is not None and int(retry_after) >= 1
        assert seconds < ANSWERED_WITHIN_S

    await locked_jobs.execute("ROLLBACK")
    status, _, _, _ = await call(http, "POST", f"{api.url}/v1/jobs", job, PRODUCER)
    assert status == 201, "the pool recovers once the lock is gone"


async def test_a_long_poll_waits_longer_than_the_budget(
    services: tuple[Service, Service], http: aiohttp.ClientSession
) -> None:
    _, dispatcher = services
    wait = 3 * BUDGET_S
    claim = {"worker_id": "w", "queues": ["empty"], "wait_seconds": wait}
    status, answer, seconds, _ = await call(
        http, "POST", f"{dispatcher.url}/v1/claim", claim, WORKER_HEADERS
    )
    assert status == 200, answer
    assert answer == {"jobs": []}
    assert seconds >= wait
