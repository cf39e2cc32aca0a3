"""Clients that misbehave at the HTTP level, over real sockets against `serve_app` (the way
every service listens): each gets a problem+json answer or a closed connection within a
bound, never a 5xx, a hang, or a WARNING."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from evora.config import Settings
from evora.http import bodies
from evora.http.app import METRICS
from evora.http.problems import PROBLEM_CONTENT_TYPE
from evora.http.serve import serve_app
from evora_services.api.app import create_app as create_api
from evora_services.dispatcher.app import create_app as create_dispatcher
from tests.polling import until
from tests.servers import PRODUCER_TOKEN, TOKENS, WORKER_TOKEN

HEAD_TIMEOUT_S = 1.0
SLOW_CLIENTS = 200
# However loaded the machine, a slow client is gone well before this; before the bounds
# such connections stayed open for minutes.
CLOSED_WITHIN_S = 15.0
TOKEN_OF = {"api": PRODUCER_TOKEN, "dispatcher": WORKER_TOKEN}


class Served:
    def __init__(self, app: web.Application, service: str, port: int) -> None:
        self.app = app
        self.service = service
        self.port = port

    def requests_counted(self, status_prefix: str) -> float:
        total = 0.0
        for family in self.app[METRICS].registry.collect():
            for sample in family.samples:
                status = sample.labels.get("status", "")
                if sample.name == "evora_http_requests_total" and status.startswith(status_prefix):
                    total += sample.value
        return total

    def in_flight(self) -> float:
        value = self.app[METRICS].registry.get_sample_value(
            "evora_http_requests_in_flight", {"service": self.service}
        )
        return value or 0.0


@contextlib.asynccontextmanager
async def serving(app: web.Application, service: str) -> AsyncIterator[Served]:
    """`app` served as `evora <service>` serves it, with a short head timeout."""
    stop = asyncio.Event()
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve_app(
            app,
            name=service,
            host="127.0.0.1",
            port=0,
            stop=stop,
            shutdown_timeout=2.0,
            started=bound.set_result,
            handler_cancellation=service == "dispatcher",
            head_timeout=HEAD_TIMEOUT_S,
        )
    )
    try:
        yield Served(app, service, await asyncio.wait_for(bound, 30))
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


@pytest.fixture
async def api(db_url: str) -> AsyncIterator[Served]:
    async with serving(await create_api(Settings(database_url=db_url, tokens=TOKENS)), "api") as s:
        yield s


@pytest.fixture
async def dispatcher(db_url: str) -> AsyncIterator[Served]:
    app = await create_dispatcher(Settings(database_url=db_url, tokens=TOKENS))
    async with serving(app, "dispatcher") as served:
        yield served


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def problem(self, status: int, code: str | None = None) -> dict[str, Any]:
        assert self.status == status, (self.status, self.body)
        assert self.headers["content-type"].startswith(PROBLEM_CONTENT_TYPE), self.headers
        problem: dict[str, Any] = orjson.loads(self.body)
        assert problem["status"] == status
        for member in ("type", "title", "detail", "code"):
            assert isinstance(problem[member], str) and problem[member], member
        if code is not None:
            assert problem["code"] == code, problem
        return problem


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Answer(int(status_line.split()[1]), headers, body)


async def exchange(port: int, request: bytes) -> Answer:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        return await asyncio.wait_for(read_answer(reader), 10)
    finally:
        writer.close()


def post(path: str, body: bytes, token: str = PRODUCER_TOKEN) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


# -- input that used to get a 500 or a wrong answer ---------------------------------------


async def test_a_token_that_is_not_utf8_is_401(api: Served) -> None:
    request = b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n\r\n"
    (await exchange(api.port, request)).problem(401, "unauthorized")


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"[1, NaN]"])
async def test_nan_and_infinity_are_malformed_json(api: Served, literal: bytes) -> None:
    body = b'{"queue": "q", "type": "t", "payload": {"x": ' + literal + b"}}"
    (await exchange(api.port, post("/v1/jobs", body))).problem(400, "malformed_json")


async def test_json_nested_too_deep_is_422(api: Served) -> None:
    payload = b"[" * 250 + b"]" * 250
    body = b'{"queue": "q", "type": "t", "payload": ' + payload + b"}"
    refused = (await exchange(api.port, post("/v1/jobs", body))).problem(422, "validation_error")
    assert "200 levels" in refused["errors"][0]["msg"]


async def test_nan_inside_a_string_is_just_text(api: Served) -> None:
    body = b'{"queue": "q", "type": "t", "payload": {"NaN": "Infinity, NaN, 1e999"}}'
    answer = await exchange(api.port, post("/v1/jobs", body))
    assert answer.status == 201, answer.body
    assert orjson.loads(answer.body)["payload"] == {"NaN": "Infinity, NaN, 1e999"}


async def _hang_up_mid_body(served: Served, caplog: pytest.LogCaptureFixture, path: str) -> None:
    head = post(path, b"x" * 1000, token=TOKEN_OF[served.service])[:-1000]
    with caplog.at_level(logging.INFO):
        for _ in range(5):
            _, writer = await asyncio.open_connection("127.0.0.1", served.port)
            writer.write(head + b'{"lease_token": ')
            await writer.drain()
            await until(lambda: served.in_flight() >= 1, within=10, what="the body being read")
            writer.close()
        await until(lambda: served.in_flight() == 0, within=10, what="the requests ended")
    assert served.requests_counted("5") == 0
    noisy = [r for r in caplog.records if r.levelno >= logging.INFO and "evora" in r.name]
    assert not noisy, [r.getMessage() for r in noisy]


async def test_a_client_that_hangs_up_mid_body_is_no_server_error(
    api: Served, caplog: pytest.LogCaptureFixture
) -> None:
    # One real request first, so that the app's database pool is open.
    first = await exchange(api.port, post("/v1/jobs", b'{"queue": "q", "type": "t"}'))
    assert first.status == 201
    await _hang_up_mid_body(api, caplog, "/v1/jobs")


async def test_a_worker_that_hangs_up_mid_body_is_no_server_error(
    dispatcher: Served, caplog: pytest.LogCaptureFixture
) -> None:
    await _hang_up_mid_body(dispatcher, caplog, f"/v1/jobs/{uuid.uuid4()}/complete")


# -- what aiohttp's parser and router refuse ----------------------------------------------


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"NOT A REQUEST\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 20_000 + b"\r\n\r\n", 400),
        (
            b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            400,
        ),
    ],
    ids=["request-line", "header", "header-too-long", "chunked"],
)
async def test_what_the_http_parser_refuses_is_a_problem(
    api: Served, request_bytes: bytes, status: int
) -> None:
    (await exchange(api.port, request_bytes)).problem(status)


@pytest.mark.parametrize(
    "header",
    [
        f"Authorization: Bearer {PRODUCER_TOKEN}\x01".encode(),
        f"X-Secret: {PRODUCER_TOKEN}\x01".encode(),
        f"Authorization: Bearer {PRODUCER_TOKEN}\r\nBad Header".encode(),
    ],
    ids=["bad-authorization", "bad-other-header", "bad-header-after-token"],
)
async def test_a_refused_request_head_is_never_echoed_back(api: Served, header: bytes) -> None:
    # A proxy that records error bodies would record whatever they quote.
    answer = await exchange(
        api.port, b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n\r\n"
    )
    answer.problem(400)
    assert PRODUCER_TOKEN.encode() not in answer.body


async def test_a_wrong_method_is_405_with_allow(api: Served) -> None:
    answer = await exchange(api.port, b"PUT /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n")
    answer.problem(405, "method_not_allowed")
    assert {"GET", "POST"} <= {m.strip() for m in answer.headers["allow"].split(",")}


# -- slow clients -------------------------------------------------------------------------


async def _closed_at(reader: asyncio.StreamReader, started: float) -> tuple[float, bytes]:
    """When the server closed the connection, and what it said before. A server that closes
    while the client still sends makes the kernel reset the connection: that counts as
    closed too."""
    said = b""
    async with asyncio.timeout(CLOSED_WITHIN_S + 30):
        try:
            while chunk := await reader.read(65536):
                said += chunk
        except ConnectionResetError:
            pass
    return time.monotonic() - started, said


async def _trickle(writer: asyncio.StreamWriter, data: bytes) -> None:
    """One byte a second, until the server closes the connection."""
    try:
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(1)
    except ConnectionError:
        pass


async def _slow_clients(port: int, first: bytes, rest: bytes) -> list[tuple[float, bytes]]:
    async def one() -> tuple[float, bytes]:
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(first)
        trickling = asyncio.create_task(_trickle(writer, rest))
        try:
            return await _closed_at(reader, started)
        finally:
            trickling.cancel()
            writer.close()

    return await asyncio.gather(*(one() for _ in range(SLOW_CLIENTS)))


async def test_slow_request_heads_are_cut_off(api: Served) -> None:
    head = b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 100
    closed = await _slow_clients(api.port, head[:10], head[10:])
    slowest = max(seconds for seconds, _ in closed)
    print(f"{SLOW_CLIENTS} slow heads: the last closed after {slowest:.1f}s")
    assert slowest < CLOSED_WITHIN_S
    for _, said in closed:
        assert said.startswith(b"HTTP/1.1 408 "), said[:100]
        assert PROBLEM_CONTENT_TYPE.encode() in said


async def test_slow_bodies_are_cut_off(api: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bodies, "BODY_GRACE_S", 1.0)
    body = b'{"queue": "q", "type": "t", "payload": "' + b"a" * 100 + b'"}'
    request = post("/v1/jobs", body)
    head_length = len(request) - len(body)
    closed = await _slow_clients(api.port, request[: head_length + 5], request[head_length + 5 :])
    slowest = max(seconds for seconds, _ in closed)
    print(f"{SLOW_CLIENTS} slow bodies: the last answered after {slowest:.1f}s")
    assert slowest < CLOSED_WITHIN_S
    for _, said in closed:
        assert said.startswith(b"HTTP/1.1 408 "), said[:100]
        assert PROBLEM_CONTENT_TYPE.encode() in said


CONNECTION_LIMIT = 50


async def test_connections_beyond_the_limit_are_answered_503_and_closed(db_url: str) -> None:
    """A crowd of clients that open connections and keep them: the process holds no more
    than EVORA_MAX_CONNECTIONS; the rest get a 503 at once and the connection closes; when
    one of the held connections goes, a new client is served again."""
    settings = Settings(database_url=db_url, tokens=TOKENS, max_connections=CONNECTION_LIMIT)
    async with serving(await create_api(settings), "api") as api:
        held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            for _ in range(CONNECTION_LIMIT):
                reader, writer = await asyncio.open_connection("127.0.0.1", api.port)
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
                assert (await read_answer(reader)).status == 200  # kept alive, then idle
                held.append((reader, writer))
            refused = []
            for _ in range(20):
                reader, writer = await asyncio.open_connection("127.0.0.1", api.port)
                answer = await asyncio.wait_for(read_answer(reader), 5)
                assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
                writer.close()
                refused.append(answer)
            for answer in refused:
                assert answer.problem(503, "unavailable")
                assert answer.headers["retry-after"] == "1"
            refusals = api.app[METRICS].registry.get_sample_value(
                "evora_http_connections_refused_total", {"service": "api"}
            )
            assert refusals == 20
            _, writer = held.pop()
            writer.close()
            await writer.wait_closed()

            async def served_again() -> bool:
                answer = await exchange(api.port, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
                return answer.status == 200

            await until(served_again, "a new connection served once one closed")
        finally:
            for _, writer in held:
                writer.close()
