"""Serving an app in a task of the test's own event loop, as `serve_app` does in production,
and the real api and dispatcher served so on a test's database."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from evora.config import Settings
from evora.http.serve import serve_app
from evora_services.api.app import create_app as create_api
from evora_services.dispatcher.app import create_app as create_dispatcher

ADMIN_TOKEN = "e2e-admin-token-0"
PRODUCER_TOKEN = "e2e-producer-token-0"
WORKER_TOKEN = "e2e-worker-token-0"
TOKENS = f"admin:{ADMIN_TOKEN},producer:{PRODUCER_TOKEN},worker:{WORKER_TOKEN}"


@dataclass
class Service:
    """One app served by `serve_app` in a task of this event loop."""

    name: str
    app: web.Application
    port: int
    stop_event: asyncio.Event
    task: asyncio.Task[None]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        self.stop_event.set()
        await asyncio.wait_for(self.task, 30)


async def serve(
    app: web.Application, name: str, *, handler_cancellation: bool = False, port: int = 0
) -> Service:
    """Start serving on loopback `port` (0: a free one); returns once it listens."""
    stop = asyncio.Event()
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve_app(
            app,
            name=name,
            host="127.0.0.1",
            port=port,
            stop=stop,
            shutdown_timeout=5.0,
            started=bound.set_result,
            handler_cancellation=handler_cancellation,
        ),
        name=f"test-{name}",
    )
    racing: set[asyncio.Future[Any]] = {bound, task}
    done, _ = await asyncio.wait(racing, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()  # raises why it could not start
        raise AssertionError(f"{name} stopped before listening")
    if not done:
        task.cancel()
        raise AssertionError(f"{name} did not start listening within 30s")
    return Service(name, app, bound.result(), stop, task)


@dataclass
class Services:
    api: Service
    dispatcher: Service


def settings_for(db_url: str, **overrides: Any) -> Settings:
    return Settings(database_url=db_url, tokens=TOKENS, **overrides)


async def start_api(db_url: str, **overrides: Any) -> Service:
    app = await create_api(settings_for(db_url, **overrides))
    return await serve(app, "api", handler_cancellation=False)


async def start_dispatcher(db_url: str, **overrides: Any) -> Service:
    # As `evora dispatcher` runs it: a handler whose worker disconnected is cancelled.
    app = await create_dispatcher(settings_for(db_url, **overrides))
    return await serve(app, "dispatcher", handler_cancellation=True)


@contextlib.asynccontextmanager
async def api_with_read_models(
    db_url: str, mongo_url: str, mongo_db: str, tokens: str
) -> AsyncIterator[str]:
    """The api, reading stats from the MongoDB read models of `mongo_db`; its base URL."""
    settings = Settings(database_url=db_url, mongo_url=mongo_url, mongo_db=mongo_db, tokens=tokens)
    server = TestServer(await create_api(settings), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()
