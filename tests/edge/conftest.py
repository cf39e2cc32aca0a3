"""Services as real child processes, for what only a whole process shows: its memory, and
how it treats connections that misbehave."""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import pytest

from tests.e2e.conftest import Child, Children, child_env, evora_command, free_port
from tests.servers import TOKENS


@dataclass
class Running:
    child: Child
    url: str

    def _status_kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.child.pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
        raise AssertionError(f"no {key} in /proc/{self.child.pid}/status")

    def rss_mib(self) -> float:
        return self._status_kib("VmRSS") / 1024

    def peak_rss_mib(self) -> float:
        return self._status_kib("VmHWM") / 1024

    def reset_peak_rss(self) -> None:
        # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
        Path(f"/proc/{self.child.pid}/clear_refs").write_text("5")


class StartService(Protocol):
    def __call__(self, service: str, **env: str) -> Coroutine[Any, Any, Running]: ...


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        yield session


@pytest.fixture
async def start_service(
    tmp_path: Path, db_url: str, http: aiohttp.ClientSession
) -> AsyncIterator[StartService]:
    """`evora api` or `evora dispatcher` as a child process, returned once it is ready."""
    children = Children(tmp_path)

    async def start(service: str, **more_env: str) -> Running:
        port = free_port()
        env = child_env(
            EVORA_DATABASE_URL=db_url,
            EVORA_TOKENS=TOKENS,
            EVORA_HOST="127.0.0.1",
            **{f"EVORA_{service.upper()}_PORT": str(port)},
            **more_env,
        )
        child = await children.spawn(service, evora_command(service), env)
        url = f"http://127.0.0.1:{port}"
        await child.until_ready(http, url)
        return Running(child, url)

    try:
        yield start
    finally:
        await children.close()
