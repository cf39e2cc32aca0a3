"""The fake that remains: a fault-injecting HTTP proxy in front of the real services.

The SDK's tests run against the real api and dispatcher (the root `services` fixture); the
contract is theirs, and nothing here implements any of it. What a real server does not do on
demand is fail at the moment a test chooses: answer one request with a 503 or a 413, lose an
answer after the work was done, answer slowly, or go away and come back on the same port.
This proxy stands between the SDK and the services for the tests that need such a failure:
it forwards every request to the service that serves its path, records what the SDK sent
(`seen`) and how many requests are in flight (`in_flight`), and lets a test stage a failure
for the next request to a route (`fault`).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from tests.servers import Services

# The worker API; every other path is the api's.
_DISPATCHER_PATH = re.compile(
    r"^/v1/(claim|acks|jobs/[^/]+/(heartbeat|complete|fail|release|snooze|checkpoints|suspend|children))$"
)
# A job id in a path, as a route names it (`/v1/jobs/batch` is a route of its own).
_JOB_ID = re.compile(r"^/v1/jobs/(?!batch$)[^/]+")
_FORWARDED_HEADERS = ("Authorization", "Content-Type", "X-Request-Id")
_ANSWERED_HEADERS = ("Content-Type", "Retry-After", "X-Request-Id")
_CODES = {413: "payload_too_large", 500: "internal_error", 503: "unavailable"}


def route_of(path: str) -> str:
    return _JOB_ID.sub("/v1/jobs/{id}", path)


@dataclass
class Fault:
    """Answer the next request to `route` with `status`; with `after`, only once the
    service has handled it (an answer lost on the way back); after `delay` seconds. With
    `with_acks`, only a request whose body carries outcomes (a claim's `acks`)."""

    method: str
    route: str
    status: int
    after: bool = False
    delay: float = 0.0
    with_acks: bool = False

    def matches(self, method: str, route: str, body: Any) -> bool:
        carries = isinstance(body, dict) and bool(body.get("acks"))
        return (self.method, self.route) == (method, route) and (carries or not self.with_acks)

    def response(self) -> web.Response:
        code = _CODES.get(self.status, f"http_{self.status}")
        body = {
            "type": f"urn:evora:problem:{code}",
            "title": "Injected by the test",
            "status": self.status,
            "detail": "injected",
            "code": code,
        }
        return web.Response(
            status=self.status, body=orjson.dumps(body), content_type="application/problem+json"
        )


@dataclass
class Seen:
    method: str
    route: str
    path: str
    body: Any


@dataclass
class FaultProxy:
    services: Services
    requests: list[Seen] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    in_flight: Counter[str] = field(default_factory=Counter)
    port: int = 0
    _runner: web.AppRunner | None = None
    _http: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Listen on 127.0.0.1, on the same port as before after a `stop()`."""
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        self.port = runner.addresses[0][1]
        self._runner = runner

    async def stop(self) -> None:
        """Go away: connections are refused until `start()`."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def close(self) -> None:
        await self.stop()
        if self._http is not None:
            await self._http.close()

    def fault(
        self,
        method: str,
        route: str,
        status: int = 503,
        *,
        after: bool = False,
        delay: float = 0,
        with_acks: bool = False,
    ) -> None:
        self.faults.append(Fault(method, route, status, after, delay, with_acks))

    def seen(self, method: str, route: str) -> list[Seen]:
        return [r for r in self.requests if r.method == method and r.route == route]

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        route = route_of(request.path)
        raw = await request.read()
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = raw
        self.requests.append(Seen(request.method, route, request.path, body))
        fault = next((f for f in self.faults if f.matches(request.method, route, body)), None)
        self.in_flight[route] += 1
        try:
            if fault is not None:
                self.faults.remove(fault)
                await asyncio.sleep(fault.delay)
                if not fault.after:
                    return fault.response()
            answer = await self._send(request, raw)
            return answer if fault is None else fault.response()
        finally:
            self.in_flight[route] -= 1

    async def _send(self, request: web.Request, raw: bytes) -> web.Response:
        assert self._http is not None
        service = (
            self.services.dispatcher if _DISPATCHER_PATH.match(request.path) else self.services.api
        )
        headers = {h: request.headers[h] for h in _FORWARDED_HEADERS if h in request.headers}
        async with self._http.request(
            request.method,
            service.url + request.path_qs,
            data=raw or None,
            headers=headers,
        ) as upstream:
            answer = await upstream.read()
            kept = {h: upstream.headers[h] for h in _ANSWERED_HEADERS if h in upstream.headers}
        return web.Response(status=upstream.status, body=answer, headers=kept)
