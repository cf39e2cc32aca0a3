"""The connection handler every service listens with: aiohttp's, plus two things it lacks.

- A request head (request line and headers) must arrive within `HEAD_TIMEOUT_S` of the
  connection opening or of its first byte after the previous response; a client that
  trickles headers (or connects and says nothing) is answered 408 and disconnected, instead
  of holding a connection and a parser buffer for as long as it likes. Idle keep-alive
  connections are left to aiohttp's keep-alive timeout.
- What aiohttp's own HTTP parser refuses (a bad request line or header, headers too long,
  broken chunked encoding) is answered as problem+json like every other error, and logged
  at debug level: it is the client's fault, not the service's.
"""

from __future__ import annotations

import asyncio
import logging
import re
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.web_request import BaseRequest

from evora.http.problems import Problem, request_timeout

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


class EdgeProtocol(web.RequestHandler):
    def __init__(
        self, manager: web.Server, *, head_timeout: float = HEAD_TIMEOUT_S, **kwargs: Any
    ) -> None:
        super().__init__(manager, **kwargs)
        self._head_timeout = head_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._between_requests = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._start_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._between_requests and self._head_timer is None:
            self._start_head_timer()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_head_timer()
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
    head = (
        f"HTTP/1.1 {problem.status} {HTTPStatus(problem.status).phrase}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body
