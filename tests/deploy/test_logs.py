"""Structured logs: one JSON object per line with ts, level, logger, msg, the service, the
request id of the HTTP request being served and fields given with `extra=`; the format is
chosen by EVORA_LOG_FORMAT (json by default, text in `evora dev`)."""

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
from collections.abc import Iterator

import aiohttp
import pytest
from aiohttp import web

from evora import cli
from evora.config import Settings
from evora.http.app import REQUEST_ID_HEADER, create_base_app
from evora.http.routing import Routes, install
from evora.logs import JsonFormatter, TextFormatter, log_context
from tests.servers import serve

log = logging.getLogger("evora.tests.logs")


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
    ("command", "env", "formatter"),
    [
        ("migrate", None, JsonFormatter),
        ("migrate", "text", TextFormatter),
        ("dev", None, TextFormatter),
        ("dev", "json", JsonFormatter),
    ],
)
def test_cli_chooses_the_format(
    command: str,
    env: str | None,
    formatter: type[logging.Formatter],
    monkeypatch: pytest.MonkeyPatch,
    root_restored: None,
) -> None:
    seen: list[logging.Formatter | None] = []

    def run(args: argparse.Namespace, settings: Settings) -> int:
        seen.append(logging.getLogger().handlers[0].formatter)
        return 0

    monkeypatch.setattr(cli, f"_{command}", run)
    monkeypatch.setenv("EVORA_DATABASE_URL", "postgresql://x@127.0.0.1:1/x")
    if env is None:
        monkeypatch.delenv("EVORA_LOG_FORMAT", raising=False)
    else:
        monkeypatch.setenv("EVORA_LOG_FORMAT", env)
    assert cli.main([command]) == 0
    (chosen,) = seen
    assert type(chosen) is formatter
    if isinstance(chosen, JsonFormatter):
        assert chosen.service == command


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_service_process_logs_json_lines() -> None:
    env = {
        **os.environ,
        "EVORA_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/none",
        "EVORA_AUTH": "disabled",
        "EVORA_API_PORT": str(_free_port()),
    }
    env.pop("EVORA_LOG_FORMAT", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "evora.cli", "api", env=env, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert process.stderr is not None
        lines = []
        while not any("listening on http" in line for line in lines):
            line = await asyncio.wait_for(process.stderr.readline(), 30)
            assert line, b"".join(lines).decode() if lines else "no output"
            lines.append(line.decode())
        process.send_signal(signal.SIGTERM)
        _, rest = await asyncio.wait_for(process.communicate(), 30)
        lines += rest.decode().splitlines()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, "".join(lines)
    events = [json.loads(line) for line in lines]
    assert all(e["service"] == "api" and {"ts", "level", "logger", "msg"} <= set(e) for e in events)
    assert any(e["level"] == "warning" and "EVORA_AUTH=disabled" in str(e["msg"]) for e in events)
