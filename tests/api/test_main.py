"""`evora_services.api.main.run`: configuration checks and where it listens."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from evora.config import ConfigError, Settings
from evora.http.serve import AppFactory
from evora_services.api import main
from tests.api.conftest import TOKENS, settings_for


class Served:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, factory: AppFactory, *, name: str, host: str, port: int) -> int:
        self.calls.append({"factory": factory, "name": name, "host": host, "port": port})
        return 0


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Served:
    fake = Served()
    monkeypatch.setattr(main, "run_service", fake)
    return fake


def test_database_url_is_required(served: Served) -> None:
    with pytest.raises(ConfigError, match="EVORA_DATABASE_URL"):
        main.run(Settings(database_url=None, tokens=TOKENS))
    assert served.calls == []


def test_tokens_are_required_while_auth_is_enabled(served: Served) -> None:
    with pytest.raises(ConfigError, match="EVORA_TOKENS"):
        main.run(Settings(database_url="postgresql://x@127.0.0.1/x", tokens=None))


async def test_serves_the_api_app_on_its_port(served: Served) -> None:
    settings = settings_for("postgresql://x@127.0.0.1:1/x", host="0.0.0.0", api_port=9090)
    assert main.run(settings) == 0
    [call] = served.calls
    assert (call["host"], call["port"]) == ("0.0.0.0", 9090)
    app = await call["factory"]()
    assert isinstance(app, web.Application)


def test_auth_disabled_warns_and_stays_on_loopback(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for("postgresql://x@127.0.0.1/x", auth="disabled", host="0.0.0.0")
    with caplog.at_level(logging.WARNING, logger=main.__name__):
        main.run(settings)
    assert served.calls[0]["host"] == "127.0.0.1"
    assert "EVORA_AUTH=disabled" in caplog.text


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_evora_api_process_serves_and_stops_on_sigterm(db_url: str) -> None:
    port = _free_port()
    env = os.environ | {
        "EVORA_DATABASE_URL": db_url,
        "EVORA_TOKENS": TOKENS,
        "EVORA_HOST": "127.0.0.1",
        "EVORA_API_PORT": str(port),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "evora_services.cli", "api", env=env, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
            for _ in range(200):  # up to ~10 s for the interpreter to start
                try:
                    async with session.get("/readyz") as response:
                        assert response.status == 200
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
            else:
                pytest.fail("evora api did not start listening")
            async with session.post(
                "/v1/jobs",
                json={"queue": "q", "type": "t"},
                headers={"Authorization": "Bearer test-producer-token"},
            ) as response:
                assert response.status == 201
        process.send_signal(signal.SIGTERM)
        _, log = await asyncio.wait_for(process.communicate(), timeout=30)
        assert process.returncode == 0, log.decode()
        assert b"evora api stopped" in log
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
