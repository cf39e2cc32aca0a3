from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from evora.config import Settings
from evora_services.dispatcher.app import create_app
from evora_services.dispatcher.state import DISPATCH, Dispatch
from tests.polling import until

TOKENS = "admin:test-admin-token,producer:test-producer-token,worker:test-worker-token"
WORKER = {"Authorization": "Bearer test-worker-token"}


@dataclass
class Dispatcher:
    url: str
    app: web.Application
    http: aiohttp.ClientSession

    @property
    def state(self) -> Dispatch:
        return self.app[DISPATCH]

    async def post(
        self, path: str, body: Any, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        async with self.http.post(
            self.url + path, json=body, headers=WORKER if headers is None else headers
        ) as response:
            return response.status, await response.json(content_type=None)

    def metric(self, name: str, **labels: str) -> float:
        value = self.app_registry().get_sample_value(name, labels)
        return value or 0.0

    def app_registry(self) -> Any:
        from evora.http.app import METRICS

        return self.app[METRICS].registry

    def empty_claims(self) -> float:
        return self.metric("evora_dispatcher_claims_total", result="empty")

    async def poll_waiting(self, queue: str, empty_claims_before: float) -> None:
        """Until one long-poll of `queue` claimed, found nothing and waits. A poll joins its
        queues' line *before* its first claim, so the line alone does not say the claim ran:
        a change made meanwhile could be seen by that claim, and the poll answered without
        any wake-up (under load, a limit raised then was)."""
        await until(
            lambda: (
                self.state.wakeups.waiting().get(queue, 0) == 1
                and self.empty_claims() > empty_claims_before
            ),
            f"a poll of {queue!r} waiting after an empty claim",
        )


@pytest.fixture
async def dispatcher(db_url: str) -> AsyncIterator[Dispatcher]:
    settings = Settings(database_url=db_url, tokens=TOKENS)
    app = await create_app(settings)
    server = TestServer(app, host="127.0.0.1", handler_cancellation=True)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as http:
            yield Dispatcher(str(server.make_url("")).rstrip("/"), app, http)
    finally:
        await server.close()
