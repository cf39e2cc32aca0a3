"""The connection handler every service listens with: aiohttp's, plus three things it lacks.

- A request head (request line and headers) must arrive within `HEAD_TIMEOUT_S` of the
  connection opening or of its first byte after the previous response; a client that
  trickles headers (or connects and says nothing) is answered 408 and disconnected, instead
  of holding a connection and a parser buffer for as long as it likes. Idle keep-alive
  connections are left to aiohttp's keep-alive timeout.
- What aiohttp's own HTTP parser refuses (a bad request line or header, headers too long,
  broken chunked encoding) is answered as problem+json like every other error, and logged
  at debug level: it is the client's fault, not the service's.
- At most `Connections.limit` connections are open at once (EVORA_MAX_CONNECTIONS): each
  costs ~13 KiB idle and up to the parser's buffer (64 KiB) with a request pending, so
  without a bound a crowd of clients that open connections and wait costs memory without
  end. One beyond it is answered 503 with Retry-After and closed at once.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_request import BaseRequest

from evora.http.metrics import ServiceMetrics
from evora.http.problems import Problem, request_timeout, unavailable

log = logging.getLogger(__name__)

HEAD_TIMEOUT_S = 10.0
# After answering a request whose body was not read (401, 413, 408...), how long aiohttp
# keeps reading and dropping the rest so the client sees the answer rather than a reset.
# Its default of 10 s lets a slow client hold the connection that much longer.
LINGER_S = 2.0


def _code(status: int) -> tuple[str, str]:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "HTTP error"
    return phrase.lower().replace(" ", "_").replace("-", "_"), phrase


# aiohttp's parser messages quote the offending bytes, which may be a header carrying a
# token; the detail keeps the description only.
_QUOTED = re.compile(r"""b?'[^'\n]*'?|"[^"\n]*"?""")


def _describe(message: str | None) -> str | None:
    if not message:
        return None
    first = _QUOTED.sub("(...)", message.strip().splitlines()[0]).rstrip(" :")
    return first or None


def parser_problem(status: int, message: str | None) -> Problem:
    code, title = _code(status)
    return Problem(status, code, title, _describe(message) or title)


@dataclass
class Connections:
    """The connections one listener has open, and how many it may."""

    limit: int
    metrics: ServiceMetrics
    open: int = 0


class EdgeProtocol(web.RequestHandler):
    def __init__(
        self,
        manager: web.Server,
        *,
        connections: Connections,
        head_timeout: float = HEAD_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self._connections = connections
        self._counted = False
        self._head_timeout = head_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._between_requests = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        connections = self._connections
        if connections.open >= connections.limit:
            log.debug("refusing a connection: %d open, the limit", connections.open)
            connections.metrics.connections_refused.labels(connections.metrics.service).inc()
            refusal = unavailable(
                f"this process has {connections.open} connections open, as many as it "
                "allows (EVORA_MAX_CONNECTIONS); retry shortly",
                title="Service busy",
            )
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(_raw_response(refusal))
            self.force_close()
            transport.close()
            return
        connections.open += 1
        self._counted = True
        self._start_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._between_requests and self._head_timer is None:
            self._start_head_timer()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_head_timer()
        if self._counted:
            self._counted = False
            self._connections.open -= 1
        super().connection_lost(exc)

    def head_received(self) -> None:
        """The app is handling a request: its head arrived in time."""
        self._between_requests = False
        self._stop_head_timer()

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._between_requests = True

    def _start_head_timer(self) -> None:
        self._head_timer = asyncio.get_running_loop().call_later(
            self._head_timeout, self._head_timed_out
        )

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        transport = self.transport
        log.debug("closing a connection whose request head took over %ss", self._head_timeout)
        if transport is not None and not transport.is_closing():
            transport.write(
                _raw_response(
                    request_timeout(
                        f"the request head did not arrive within {self._head_timeout:.0f}s"
                    )
                )
            )
        self.force_close()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            self.log_exception("error handling a request from %s", request.remote, exc_info=exc)
        else:
            log.debug("refused a request from %s: %s %s", request.remote, status, message)
        if request.writer.output_size > 0:
            raise ConnectionError("the response was partly sent; cannot send an error instead")
        response = parser_problem(status, message).response()
        response.force_close()
        return response


def _raw_response(problem: Problem) -> bytes:
    """A whole HTTP/1.1 response, for when no request exists to answer through."""
    response = problem.response()
    body = bytes(response.body) if isinstance(response.body, bytes | bytearray) else b""
    extra = "".join(f"{name}: {value}\r\n" for name, value in problem.headers.items())
    head = (
        f"HTTP/1.1 {problem.status} {HTTPStatus(problem.status).phrase}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"{extra}Connection: close\r\n\r\n"
    )
    return head.encode() + body
