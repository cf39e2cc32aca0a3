"""Structured logs: one JSON object per line with ts, level, logger, msg, the service, the
request id of the HTTP request being served and fields given with `extra=`; the format is
chosen by EVORA_LOG_FORMAT (json by default, text in `evora dev`). No token is ever written."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator

import aiohttp
import pytest
from aiohttp import web

from evora.config import Settings
from evora.http.app import REQUEST_ID_HEADER, create_base_app
from evora.http.routing import Routes, install
from evora.logs import (
    REDACTED,
    JsonFormatter,
    Redaction,
    TextFormatter,
    configure_logging,
    log_context,
    redact_secrets,
)
from evora_services import cli
from tests.servers import serve

log = logging.getLogger("evora.tests.logs")

TOKEN = "producer-token-0123456789"  # a configured token
ADMIN_TOKEN = "admin-token-0123456789"


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """Records of `log` as the JSON formatter writes them."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("api"))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield stream
    finally:
        log.removeHandler(handler)


@pytest.fixture
def root_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def _events(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_one_json_object_per_line(captured: io.StringIO) -> None:
    with log_context(job_id="j-1", queue="emails", ignored=None):
        log.info("claimed %d jobs\nsecond line", 2, extra={"worker_id": "w-1"})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    first, second = _events(captured)
    assert first["msg"] == "claimed 2 jobs\nsecond line"
    assert first["level"] == "info" and first["logger"] == "evora.tests.logs"
    assert str(first["ts"]).endswith("Z") and "T" in str(first["ts"])
    assert (first["service"], first["job_id"], first["queue"]) == ("api", "j-1", "emails")
    assert first["worker_id"] == "w-1" and "ignored" not in first
    assert "job_id" not in second and second["level"] == "error"
    assert "ValueError: boom" in str(second["exc"])


def test_text_format_is_one_readable_line() -> None:
    record = logging.LogRecord("evora.x", logging.WARNING, __file__, 1, "hi %s", ("there",), None)
    with log_context(request_id="r-1"):
        line = TextFormatter("api").format(record)
    assert line.endswith("WARNING evora.x: hi there request_id=r-1")


async def test_request_id_is_on_every_record_of_the_request(captured: io.StringIO) -> None:
    app = create_base_app(Settings(auth="disabled"), "api", "test")
    routes = Routes("test")

    @routes.add("GET", "/log", roles=None, summary="logs one line")
    async def handler(request: web.Request) -> web.Response:
        await asyncio.sleep(0)
        log.info("inside")
        return web.json_response({})

    install(app, routes)
    service = await serve(app, "t")
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(
                f"{service.url}/log", headers={REQUEST_ID_HEADER: "req-42"}
            ) as response:
                assert response.headers[REQUEST_ID_HEADER] == "req-42"
            async with http.get(f"{service.url}/log") as response:
                generated = response.headers[REQUEST_ID_HEADER]
        log.info("outside")
    finally:
        await service.close()
    inside_1, inside_2, outside = _events(captured)
    assert inside_1["request_id"] == "req-42"
    assert inside_2["request_id"] == generated and len(generated) == 32
    assert "request_id" not in outside


@pytest.mark.parametrize(
    ("command", "env", "tty", "formatter"),
    [
        (["migrate"], None, False, JsonFormatter),
        (["migrate"], "text", False, TextFormatter),
        (["migrate"], None, True, TextFormatter),
        (["migrate"], "json", True, JsonFormatter),
        (["dev"], None, False, TextFormatter),
        (["dev"], "json", False, JsonFormatter),
        # A worker in a terminal is read by a person; one under a supervisor by a collector.
        (["worker", "handlers"], None, True, TextFormatter),
        (["worker", "handlers"], None, False, JsonFormatter),
        (["worker", "handlers"], "json", True, JsonFormatter),
    ],
)
def test_cli_chooses_the_format(
    command: list[str],
    env: str | None,
    tty: bool,
    formatter: type[logging.Formatter],
    monkeypatch: pytest.MonkeyPatch,
    root_restored: None,
) -> None:
    seen: list[logging.Formatter | None] = []

    def run(args: argparse.Namespace, settings_or_url: object) -> int:
        seen.append(logging.getLogger().handlers[0].formatter)
        return 0

    monkeypatch.setattr(cli, f"_{command[0]}", run)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    monkeypatch.setenv("EVORA_DATABASE_URL", "postgresql://x@127.0.0.1:1/x")
    if env is None:
        monkeypatch.delenv("EVORA_LOG_FORMAT", raising=False)
    else:
        monkeypatch.setenv("EVORA_LOG_FORMAT", env)
    assert cli.main(command) == 0
    (chosen,) = seen
    assert type(chosen) is formatter
    if isinstance(chosen, JsonFormatter):
        assert chosen.service == command[0]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _api_process_logs(
    env: dict[str, str], while_up: Callable[[int], Awaitable[None]] | None = None
) -> list[str]:
    """Everything `evora api` writes to stderr from start to a SIGTERM stop, JSON lines by
    default, with `while_up(port)` run against it in between."""
    port = _free_port()
    env = {
        **os.environ,
        "EVORA_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none",
        "EVORA_API_PORT": str(port),
        **env,
    }
    env.pop("EVORA_LOG_FORMAT", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "evora_services.cli", "api", env=env, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert process.stderr is not None
        lines: list[str] = []
        while not any("listening on http" in line for line in lines):
            line = await asyncio.wait_for(process.stderr.readline(), 30)
            assert line, "".join(lines) if lines else "no output"
            lines.append(line.decode())
        if while_up is not None:
            await while_up(port)
        process.send_signal(signal.SIGTERM)
        _, rest = await asyncio.wait_for(process.communicate(), 30)
        lines += rest.decode().splitlines()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, "".join(lines)
    return lines


async def test_a_service_process_logs_json_lines() -> None:
    lines = await _api_process_logs({"EVORA_AUTH": "disabled"})
    events = [json.loads(line) for line in lines]
    assert all(e["service"] == "api" and {"ts", "level", "logger", "msg"} <= set(e) for e in events)
    assert any(e["level"] == "warning" and "EVORA_AUTH=disabled" in str(e["msg"]) for e in events)


async def test_a_service_says_at_start_up_that_its_database_is_unreachable() -> None:
    lines = await _api_process_logs({"EVORA_AUTH": "disabled"})
    events = [json.loads(line) for line in lines]
    listening = next(i for i, e in enumerate(events) if "listening on http" in e["msg"])
    assert any(
        e["level"] == "warning"
        and e["msg"].startswith("PostgreSQL unreachable: ")
        and e["msg"].endswith(": answering 503 until that changes (/readyz says why)")
        for e in events[:listening]
    ), lines


# Requests aiohttp cannot parse: its parser error quotes the offending raw line (here the one
# carrying the token), and the service logs that error (at DEBUG: the client's fault).
MALFORMED = [
    f"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\x01\r\n\r\n",
    f"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: {ADMIN_TOKEN}\x01\r\n\r\n",
    f"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Token: bearer {ADMIN_TOKEN}\x7f\r\n\r\n",
]


async def _send_raw(port: int, request: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request.encode("latin-1"))
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


async def test_a_malformed_request_never_logs_its_token() -> None:
    async def send_malformed(port: int) -> None:
        for request in MALFORMED:
            assert (await _send_raw(port, request)).startswith(b"HTTP/1.0 400")

    lines = await _api_process_logs(
        {"EVORA_TOKENS": f"admin:{ADMIN_TOKEN},producer:{TOKEN}", "EVORA_LOG_LEVEL": "DEBUG"},
        send_malformed,
    )
    output = "".join(lines)
    assert TOKEN not in output and ADMIN_TOKEN not in output
    events = [json.loads(line) for line in lines]
    refused = [e for e in events if e["logger"] == "evora.http.protocol" and "refused" in e["msg"]]
    assert len(refused) == len(MALFORMED), output
    # The records are still there, with the parser's reason and the token's place marked.
    assert all("Invalid header value" in e["msg"] and REDACTED in e["msg"] for e in refused)


def test_redaction_covers_message_fields_context_and_tracebacks(captured: io.StringIO) -> None:
    redaction = Redaction([TOKEN])
    log.handlers[-1].addFilter(redaction)
    with log_context(request_id=f"Bearer {ADMIN_TOKEN}"):
        try:
            raise ValueError(f"b'Authorization: Bearer {ADMIN_TOKEN}\\x01'")
        except ValueError:
            log.exception(
                "token %s in %r", TOKEN, {"auth": f"bearer {ADMIN_TOKEN}"}, extra={"hdr": TOKEN}
            )
        log.warning("%s", f"x={TOKEN}y", stack_info=True)
        log.info("bad format %d", TOKEN)  # a broken call is written, redacted, not raised
    first, second, third = _events(captured)
    assert TOKEN not in captured.getvalue() and ADMIN_TOKEN not in captured.getvalue()
    assert first["msg"] == f"token {REDACTED} in {{'auth': 'bearer {REDACTED}'}}"
    assert first["request_id"] == f"Bearer {REDACTED}" and first["hdr"] == REDACTED
    # A bearer credential runs to the next space or quote, escapes included.
    assert str(first["exc"]).endswith(f"ValueError: b'Authorization: Bearer {REDACTED}'")
    assert second["msg"] == f"x={REDACTED}y" and "Stack (most recent call last)" in str(
        second["stack"]
    )
    assert third["msg"] == f"bad format %d ('{REDACTED}',)"
    assert redaction.redact("Bearer") == "Bearer"  # text without a token is left alone


@pytest.mark.parametrize(
    "name", ["aiohttp.server", "aiohttp.access", "aiohttp.web", "asyncio", "", "evora.x"]
)
@pytest.mark.parametrize("fmt", ["json", "text"])
def test_every_logger_is_redacted(
    name: str, fmt: str, capsys: pytest.CaptureFixture[str], root_restored: None
) -> None:
    configure_logging("INFO", "json" if fmt == "json" else "text", "api", secrets=[TOKEN])
    redact_secrets([ADMIN_TOKEN])  # known only later, as the tokens `evora dev` generates
    try:
        raise RuntimeError(f"{TOKEN} / Authorization: Bearer unknown-but-secret")
    except RuntimeError as exc:
        logging.getLogger(name).error("failed on %s", ADMIN_TOKEN, exc_info=exc)
    written = capsys.readouterr().err
    assert f"failed on {REDACTED}" in written and f"RuntimeError: {REDACTED}" in written
    for secret in (TOKEN, ADMIN_TOKEN, "unknown-but-secret"):
        assert secret not in written
