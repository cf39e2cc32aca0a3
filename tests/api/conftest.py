"""The real `evora api` app on a real PostgreSQL, driven over HTTP by aiohttp's test client."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer

from evora.config import Settings
from evora.http.problems import PROBLEM_CONTENT_TYPE
from evora.storage.jobs import Failure, JobStore
from evora_services.api.app import create_app
from evora_services.api.routes import STORE
from tests.databases import create_database

TOKENS = "admin:test-admin-token,producer:test-producer-token,worker:test-worker-token"
ADMIN = {"Authorization": "Bearer test-admin-token"}
PRODUCER = {"Authorization": "Bearer test-producer-token"}
WORKER = {"Authorization": "Bearer test-worker-token"}

ApiClient = TestClient[web.Request, web.Application]
MakeClient = Callable[[Settings], Awaitable[ApiClient]]


def settings_for(database_url: str, **overrides: Any) -> Settings:
    return Settings(database_url=database_url, tokens=TOKENS, **overrides)


async def start_client(settings: Settings) -> ApiClient:
    """The api app with these settings, listening on loopback, and a client for it."""
    client: ApiClient = TestClient(TestServer(await create_app(settings)))
    await client.start_server()
    return client


@pytest.fixture
async def make_client() -> AsyncIterator[MakeClient]:
    """Starts the api app with the given settings; every client is closed after the test."""
    clients: list[ApiClient] = []

    async def make(settings: Settings) -> ApiClient:
        clients.append(await start_client(settings))
        return clients[-1]

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
def settings(db_url: str) -> Settings:
    return settings_for(db_url)


@pytest.fixture
async def client(make_client: MakeClient, settings: Settings) -> ApiClient:
    return await make_client(settings)


@pytest.fixture
def store(client: ApiClient) -> JobStore:
    """The app's own store, for putting jobs into states only workers can reach."""
    return client.app[STORE]


@pytest.fixture
def db(plain_conn: asyncpg.Connection) -> asyncpg.Connection:
    """A direct connection, to check what was (not) stored."""
    return plain_conn


@contextlib.asynccontextmanager
async def database(server_url: str, template: str | None = None) -> AsyncIterator[str]:
    """A new database on the server (a clone of `template`, if given), dropped afterwards."""
    name = f"test_api_{uuid.uuid4().hex}"
    admin = await asyncpg.connect(server_url)
    try:
        await create_database(admin, name, template)
        yield urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def unmigrated_db_url(pg_server_url: str) -> AsyncIterator[str]:
    """A database that exists but has no Evora schema."""
    async with database(pg_server_url) as url:
        yield url


@pytest.fixture(scope="module")
async def shared_client(pg_server_url: str, template_db: str) -> AsyncIterator[ApiClient]:
    """One app and database for a whole module, for tests that neither depend on nor
    check what else is stored (auth, validation, unknown ids), so they need no fresh
    database each."""
    async with database(pg_server_url, template_db) as url:
        client = await start_client(settings_for(url))
        try:
            yield client
        finally:
            await client.close()


def job(queue: str = "emails", type: str = "email.send", **fields: Any) -> dict[str, Any]:
    """A submission body."""
    return {"queue": queue, "type": type, **fields}


async def problem(response: ClientResponse, status: int, code: str) -> dict[str, Any]:
    """Assert that `response` is an RFC 9457 problem with this status and code."""
    assert response.status == status, await response.text()
    assert response.content_type == PROBLEM_CONTENT_TYPE
    body: dict[str, Any] = await response.json(content_type=None)
    assert body["status"] == status
    assert body["code"] == code
    for member, kind in (("type", str), ("title", str), ("detail", str)):
        assert isinstance(body[member], kind) and body[member], member
    return body


async def created(client: ApiClient, **fields: Any) -> dict[str, Any]:
    """Submit a job over HTTP and return it."""
    response = await client.post("/v1/jobs", json=job(**fields), headers=PRODUCER)
    assert response.status == 201, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def job_in_state(
    client: ApiClient, store: JobStore, state: str, **fields: Any
) -> dict[str, Any]:
    """A job moved into `state` the way workers move jobs; returns it as the API shows it.
    Without a `queue` it gets one of its own; with one, that queue must have no other
    PENDING job, so that the claim picks this one."""
    fields.setdefault("queue", f"q-{uuid.uuid4().hex[:12]}")
    queue = fields["queue"]
    submitted = await created(client, max_attempts=1, **fields)
    if state != "PENDING":
        [claimed] = await store.claim(worker_id="w1", queues=[queue])
        job_id, token = claimed["id"], claimed["lease_token"]
        if state == "COMPLETED":
            await store.complete(job_id, token, {"ok": True})
        elif state == "DLQ":
            await store.fail(Failure(job_id, token, "boom", retryable=False))
        elif state == "CANCELLED":
            await store.cancel(job_id)
            await store.release(job_id, token)
        else:
            assert state == "RUNNING", state
    response = await client.get(f"/v1/jobs/{submitted['id']}", headers=PRODUCER)
    current: dict[str, Any] = await response.json()
    assert current["state"] == state
    return current
