"""The real sweeper app on a real PostgreSQL. Jobs are put into states the way workers would
(the root `store` fixture) and deadlines pass by running the database's clock ahead (the
root `clock` fixture) before the sweeper starts, so nothing waits for real time; every wait
is a bounded poll of observable state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from evora.config import Settings
from evora.http.app import METRICS
from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import JobStore
from evora.storage.rows import JobDict
from evora_services.sweeper.app import SWEEPER, create_app
from evora_services.sweeper.sweeper import Sweeper, Tuning
from tests.polling import until

TOKENS = "admin:test-admin-token,producer:test-producer-token,worker:test-worker-token"

# Quick enough that tests driven through the running loop finish fast, and a standby takes
# over within a fraction of a second.
FAST = Tuning(max_wait=0.1, retention_every=0.2, observe_every=0.1, standby_seconds=0.1)


@dataclass
class RunningSweeper:
    url: str
    app: web.Application
    http: aiohttp.ClientSession

    @property
    def sweeper(self) -> Sweeper:
        return self.app[SWEEPER]

    def metric(self, name: str, **labels: str) -> float:
        value = self.app[METRICS].registry.get_sample_value(name, labels)
        return value or 0.0

    @property
    def active(self) -> bool:
        return self.metric("evora_sweeper_active") == 1

    async def get(self, path: str) -> tuple[int, str]:
        async with self.http.get(self.url + path) as response:
            return response.status, await response.text()


StartSweeper = Callable[..., Awaitable[RunningSweeper]]


async def counted(running: RunningSweeper, name: str, **labels: str) -> None:
    """Until `running` counted one of what the test saw in the database: a sweeper counts
    after its statement returned, and that statement's commit is visible to others a moment
    before (a loaded machine stretches the moment)."""
    await until(lambda: running.metric(name, **labels) == 1, f"{name} {labels} counted once")


@pytest.fixture
async def start_sweeper(db_url: str) -> AsyncIterator[StartSweeper]:
    """Starts sweeper apps on the test's database (`tuning`, setting overrides); all are
    stopped gracefully afterwards."""
    servers: list[TestServer] = []
    async with aiohttp.ClientSession() as http:

        async def start(tuning: Tuning = FAST, **overrides: Any) -> RunningSweeper:
            settings = Settings(database_url=db_url, tokens=TOKENS, **overrides)
            app = await create_app(settings, tuning)
            server = TestServer(app, host="127.0.0.1")
            await server.start_server()
            servers.append(server)
            return RunningSweeper(str(server.make_url("")).rstrip("/"), app, http)

        try:
            yield start
        finally:
            for server in servers:
                await server.close()


async def submit(store: JobStore, queue: str = "q", **fields: Any) -> UUID:
    result = await store.submit(JobSubmission(queue=queue, type="t", **fields))
    job_id: UUID = result.job["id"]
    return job_id


async def claimed(store: JobStore, queue: str = "q", **fields: Any) -> JobDict:
    """A job submitted to a queue of its own making and claimed by worker `w`."""
    job_id = await submit(store, queue, **fields)
    [job] = await store.claim(worker_id="w", queues=[queue])
    assert job["id"] == job_id
    return job


async def force_lease_expiry(pool: asyncpg.Pool, *job_ids: UUID) -> None:
    """Let leases run out now, under a sweeper that is already running: its connections
    keep the clock they opened with, so the deadline itself moves (a deadline change, not a
    transition: no event, no trigger). Where the sweeper starts afterwards, tests run the
    `clock` ahead instead."""
    status = await pool.execute(
        "UPDATE evora.jobs SET lease_expires_at = now() - interval '1 s' WHERE id ="
        " ANY($1::uuid[])",
        list(job_ids),
    )
    assert status == f"UPDATE {len(job_ids)}"


async def done_or_waiting(pool: asyncpg.Pool, task: asyncio.Task[Any]) -> bool:
    """Whether `task` (a pass run against rows a held transaction writes) has finished, or
    some session of the test's database waits for a lock: the moment the held transaction
    commits, the unlucky one."""
    waits = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    return task.done() or bool(waits)


async def events(pool: asyncpg.Pool, job_id: UUID) -> list[tuple[str, dict[str, Any]]]:
    rows = await pool.fetch(
        "SELECT event, data FROM evora.job_events WHERE job_id = $1 ORDER BY job_version", job_id
    )
    return [(r["event"], r["data"]) for r in rows]


async def event_names(pool: asyncpg.Pool, job_id: UUID) -> list[str]:
    return [name for name, _ in await events(pool, job_id)]
