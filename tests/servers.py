"""Serving an app in a task of the test's own event loop, as `serve_app` does in production."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from evora.http.serve import serve_app


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
