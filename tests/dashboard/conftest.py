"""The dashboard in a real browser: the real api (PostgreSQL + MongoDB read models kept
current by the real Projector running beside it) and Debian's Chromium, headless, driven
by Playwright for Python (its bundled driver only; no browser download).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, ConsoleMessage, Page, async_playwright
from pymongo.asynchronous.database import AsyncDatabase

from evora.config import Settings
from evora.http.metrics import ServiceMetrics
from evora.readmodels.client import mongo_client
from evora.readmodels.layout import CONTROL, Document, checkpoint_id
from evora.storage.jobs import Completion, Failure, JobStore
from evora_services.api.app import create_app
from evora_services.projector.metrics import ProjectorMetrics
from evora_services.projector.service import ProjectorService

ADMIN_TOKEN = "dashboard-admin-token"
PRODUCER_TOKEN = "dashboard-producer-token"
TOKENS = f"admin:{ADMIN_TOKEN},producer:{PRODUCER_TOKEN},worker:dashboard-worker-token"

CATCH_UP_SECONDS = 15.0
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
# Chromium's flags for a closed network (see .library machines notes): no background
# fetches, no component updates, no GPU.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--disable-default-apps",
    "--disable-extensions",
]
# What Chromium logs for an api answer of 4xx that the page expected (a wrong token's 401,
# a queue the read models have not seen yet): not an error of the page.
EXPECTED_CONSOLE = "Failed to load resource: the server responded with a status of 4"


def chromium_path() -> str | None:
    for candidate in (os.environ.get("EVORA_CHROMIUM"), "/usr/bin/chromium", "chromium"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


@pytest.fixture(scope="session")
async def browser() -> AsyncIterator[Browser]:
    path = chromium_path()
    if path is None:
        message = "Debian's chromium is not installed (scripts/test.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=path, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            await launched.close()


@dataclass
class Dashboard:
    """The running api and what the tests use to put jobs into states."""

    url: str
    pool: asyncpg.Pool
    store: JobStore
    mongo: AsyncDatabase[Document]
    http: aiohttp.ClientSession
    projector: ProjectorService

    async def submit(self, **fields: Any) -> dict[str, Any]:
        """Submit a job over HTTP with the producer token, as a producer would."""
        async with self.http.post(
            self.url + "/v1/jobs",
            json=fields,
            headers={"Authorization": f"Bearer {PRODUCER_TOKEN}"},
        ) as response:
            assert response.status == 201, await response.text()
            job: dict[str, Any] = await response.json()
            return job

    async def dead_letter(
        self,
        queue: str,
        message: str = "boom",
        error_type: str | None = None,
        worker_id: str = "worker-dlq",
        **fields: Any,
    ) -> dict[str, Any]:
        """A job in `queue` (which has no other PENDING job) moved to the DLQ the way a
        worker would."""
        fields.setdefault("type", "demo.task")
        job = await self.submit(queue=queue, max_attempts=1, **fields)
        [claimed] = await self.store.claim(worker_id=worker_id, queues=[queue])
        assert str(claimed["id"]) == job["id"]
        await self.store.fail(
            Failure(claimed["id"], claimed["lease_token"], message, error_type, retryable=False)
        )
        return job

    async def complete_all(self, queue: str, worker_id: str = "worker-1") -> int:
        claimed = await self.store.claim(worker_id=worker_id, queues=[queue], max_jobs=100)
        await self.store.complete_many(
            [Completion(j["id"], j["lease_token"], {"ok": True}) for j in claimed]
        )
        return len(claimed)

    async def caught_up(self) -> int:
        """Wait until the projector has applied every event; returns the newest seq."""
        newest = int(await self.pool.fetchval("SELECT coalesce(max(seq), 0) FROM evora.job_events"))
        async with asyncio.timeout(CATCH_UP_SECONDS):
            while True:
                self.projector.wake.set()
                doc = await self.mongo[CONTROL].find_one({"_id": checkpoint_id(1)})
                if newest == 0 or (doc and int(doc.get("max_seq", 0)) >= newest):
                    return newest
                await asyncio.sleep(0.05)


@pytest.fixture
async def dashboard(
    db_url: str, pool: asyncpg.Pool, mongo_url: str, mongo_db_name: str
) -> AsyncIterator[Dashboard]:
    settings = Settings(
        database_url=db_url, mongo_url=mongo_url, mongo_db=mongo_db_name, tokens=TOKENS
    )
    server = TestServer(await create_app(settings), host="127.0.0.1")
    await server.start_server()
    client = mongo_client(mongo_url, "evora-dashboard-tests")
    mongo = client[mongo_db_name]
    # The projector service's own loop, as `evora projector` runs it while it holds the lock.
    service = ProjectorService(pool, mongo, ProjectorMetrics(ServiceMetrics("projector")))
    ended = asyncio.Event()
    projecting = asyncio.create_task(service.lead(ended))
    try:
        async with aiohttp.ClientSession() as http:
            yield Dashboard(
                str(server.make_url("")).rstrip("/"), pool, JobStore(pool), mongo, http, service
            )
    finally:
        ended.set()
        service.wake.set()
        await asyncio.wait_for(projecting, 10)
        await client.close()
        await server.close()


@dataclass
class Problems:
    """What the page reported as wrong: script errors, CSP refusals, failed loads."""

    messages: list[str] = field(default_factory=list)

    def console(self, message: ConsoleMessage) -> None:
        if message.type == "error" and not message.text.startswith(EXPECTED_CONSOLE):
            self.messages.append(f"console: {message.text}")


@pytest.fixture
def problems() -> Problems:
    return Problems()


@pytest.fixture
async def page(browser: Browser, problems: Problems) -> AsyncIterator[Page]:
    context = await browser.new_context(
        viewport={"width": 1360, "height": 900}, color_scheme="light", locale="en-US"
    )
    context.set_default_timeout(10_000)
    page = await context.new_page()
    page.on("console", problems.console)
    page.on("pageerror", lambda error: problems.messages.append(f"pageerror: {error}"))
    try:
        yield page
    finally:
        await context.close()
    # Every page must run under its CSP without a single refusal or script error.
    assert problems.messages == []


async def login(page: Page, url: str, token: str = ADMIN_TOKEN) -> None:
    await page.goto(url + "/")
    await page.get_by_label("Admin token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await page.get_by_role("heading", name="Queues", level=1).wait_for()


def screenshot_path(name: str, tmp_path: Path) -> Path:
    """docs/screenshots/NAME.png when EVORA_SCREENSHOTS=1 (to refresh the README's
    pictures), else a temporary file, so a test run leaves the work tree alone."""
    if os.environ.get("EVORA_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        return SCREENSHOTS / f"{name}.png"
    return tmp_path / f"{name}.png"


@pytest.fixture
def shots(tmp_path: Path) -> Any:
    async def take(page: Page, name: str) -> Path:
        path = screenshot_path(name, tmp_path)
        await page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 10_000  # a real picture, not a blank page
        return path

    return take
