"""Submitting in SQL on a real PostgreSQL: an application's own connection, the real api and
dispatcher beside it, and roles made the way docs/sql-enqueue.md tells an operator to."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from evora.config import Settings
from evora_services.api.app import create_app as create_api
from evora_services.dispatcher.app import create_app as create_dispatcher
from tests.servers import Service, serve

PRODUCER_TOKEN = "sql-producer-token-0"
WORKER_TOKEN = "sql-worker-token-0"
TOKENS = f"producer:{PRODUCER_TOKEN},worker:{WORKER_TOKEN}"
PRODUCER = {"Authorization": f"Bearer {PRODUCER_TOKEN}"}
WORKER = {"Authorization": f"Bearer {WORKER_TOKEN}"}

MakeRole = Callable[..., Awaitable[str]]


@pytest.fixture
def app_conn(plain_conn: asyncpg.Connection) -> asyncpg.Connection:
    """The application's own connection (plain asyncpg, no Evora codecs)."""
    return plain_conn


@pytest.fixture
async def api(db_url: str) -> AsyncIterator[Service]:
    service = await serve(await create_api(Settings(database_url=db_url, tokens=TOKENS)), "api")
    yield service
    await service.close()


@pytest.fixture
async def dispatcher(db_url: str) -> AsyncIterator[Service]:
    app = await create_dispatcher(Settings(database_url=db_url, tokens=TOKENS))
    service = await serve(app, "dispatcher", handler_cancellation=True)
    yield service
    await service.close()


@pytest.fixture
async def make_role(db_url: str, app_conn: asyncpg.Connection) -> AsyncIterator[MakeRole]:
    """Creates a login role granted only `grants` (the docs' GRANT); returns its DSN. Roles
    belong to the whole server, so each is dropped after the test."""
    made: list[str] = []

    async def make(*grants: str) -> str:
        name = f"app_{uuid.uuid4().hex[:12]}"
        await app_conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'app-password'")
        made.append(name)
        for grant in grants:
            await app_conn.execute(f"GRANT {grant} TO {name}")
        parts = urlsplit(db_url)
        netloc = f"{name}:app-password@{parts.hostname}:{parts.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    yield make
    for name in made:
        await app_conn.execute(f"DROP OWNED BY {name}")
        await app_conn.execute(f"DROP ROLE {name}")
