"""HTTP plumbing shared by `Client` and `Worker`: one pooled aiohttp session, JSON bodies
through orjson, a timeout on every call, typed errors, and retries only where they are safe.

Whether a call may be repeated is the caller's decision (`idempotent=`); this module only
knows which failures are worth repeating:

- the connection could not be established: the server never saw the request, so any call
  may be repeated;
- the connection broke or timed out after the request was sent, or a gateway answered
  502/503/504: the server may have acted on it, so only idempotent calls are repeated;
- any other answer (4xx, 500) is final: repeating it would get the same answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import orjson

from evora.protocol.positions import READ_AFTER_HEADER, format_position, parse_position
from evora.protocol.retries import RETRYABLE_STATUSES, RetryBackoff
from evora.sdk.errors import (
    EvoraClientError,
    EvoraConnectionError,
    EvoraHTTPError,
    error_from_response,
)

log = logging.getLogger("evora.sdk")


def should_retry(error: EvoraClientError, *, idempotent: bool) -> bool:
    """Whether a call that failed with `error` may be sent again (see the module docstring)."""
    if isinstance(error, EvoraConnectionError):
        return idempotent or not error.request_sent
    if isinstance(error, EvoraHTTPError):
        return idempotent and error.status in RETRYABLE_STATUSES
    return False


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]
    data: Any


class _NoBody:
    pass


NO_BODY: Final = _NoBody()


class Transport:
    """One base URL, one token, one aiohttp session (created on first use, inside the loop).

    It keeps the highest `Evora-Read-After` position any answer carried and sends it with
    every request, so that an api reading from a replica shows this client its own writes
    and never anything older than what it showed it before (docs/http-api.md#read-after)."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        timeout: float,
        retries: int,
        backoff: RetryBackoff,
        connection_limit: int = 100,
    ) -> None:
        if timeout <= 0 or retries < 0:
            raise ValueError("timeout must be positive and retries not negative")
        self.base_url = base_url.rstrip("/")
        self._headers = {"Accept": "application/json, application/problem+json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = timeout
        self._retries = retries
        self._backoff = backoff
        self._connection_limit = connection_limit
        self._session: aiohttp.ClientSession | None = None
        self.read_after = 0

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                connector=aiohttp.TCPConnector(limit=self._connection_limit),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = NO_BODY,
        params: Mapping[str, str] | None = None,
        idempotent: bool,
        time_limit: float | None = None,
        retries: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """Send a request, retrying as `should_retry` allows; raises `EvoraClientError`.

        `time_limit` replaces the default timeout (seconds) of each attempt; `headers` are
        sent besides the session's."""
        data = None if isinstance(body, _NoBody) else orjson.dumps(body)
        max_retries = self._retries if retries is None else retries
        attempt = 1
        while True:
            try:
                return await self._send_once(
                    method, path, data, params, time_limit or self._timeout, headers
                )
            except EvoraClientError as exc:
                exc.attempts = attempt
                if attempt > max_retries or not should_retry(exc, idempotent=idempotent):
                    raise
                delay = self._backoff.delay(attempt)
                log.info("%s %s failed (%s); retry %d in %.2fs", method, path, exc, attempt, delay)
            await asyncio.sleep(delay)
            attempt += 1

    async def _send_once(
        self,
        method: str,
        path: str,
        data: bytes | None,
        params: Mapping[str, str] | None,
        time_limit: float,
        extra_headers: Mapping[str, str] | None,
    ) -> Response:
        headers = dict(extra_headers or {})
        if self.read_after:
            headers[READ_AFTER_HEADER] = format_position(self.read_after)
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            async with self._get_session().request(
                method,
                self.base_url + path,
                data=data,
                params=params,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=time_limit),
            ) as resp:
                raw = await resp.read()
                status, reason, resp_headers = resp.status, resp.reason, resp.headers
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise EvoraConnectionError(
                f"cannot connect to {self.base_url}: {exc}", request_sent=False
            ) from exc
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason_text = str(exc) or type(exc).__name__
            raise EvoraConnectionError(
                f"{method} {path}: no answer ({reason_text})", request_sent=True
            ) from exc
        if (position := parse_position(resp_headers.get(READ_AFTER_HEADER, ""))) is not None:
            self.read_after = max(self.read_after, position)
        if status >= 400:
            raise error_from_response(status, raw, reason=reason)
        try:
            decoded = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError as exc:
            raise EvoraClientError(f"{method} {path}: the answer is not JSON") from exc
        return Response(status, resp_headers, decoded)
