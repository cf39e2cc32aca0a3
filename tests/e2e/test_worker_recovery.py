"""A worker comes back within about a second of the dispatcher being ready again after
PostgreSQL was down, however far its claim backoff has grown (evora.sdk.worker's
`_back_off`): PostgreSQL stopped and started under a running SDK worker and a dispatcher
process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import asyncpg

from evora import Handlers, Job, Worker
from evora.embedded import LocalPostgres
from evora.protocol.jobs import JobSubmission
from evora.protocol.retries import RetryBackoff
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations
from tests.e2e.conftest import Children
from tests.fuzz.conftest import spawn
from tests.polling import until
from tests.servers import WORKER_TOKEN

QUEUE = "recovery"
# Far longer than the outage: without the readiness probes the worker would sleep 30-60 s
# after its first failed claim, whatever happened meanwhile (far enough from a probe and a
# claim, which a loaded machine can stretch to several seconds, for the two never to meet).
SLOW_BACKOFF = RetryBackoff(initial=60.0, max_delay=60.0)
OUTAGE_SECONDS = 3.0


async def _ready(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url + "/readyz") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def _submit(dsn: str) -> str:
    pool = await create_pool(dsn, min_size=1, max_size=1)
    try:
        store = JobStore(pool)
        try:
            submitted = await store.submit(JobSubmission(queue=QUEUE, type="t"))
        finally:
            await store.close()
    finally:
        await pool.close()
    return str(submitted.job["id"])


async def test_worker_claims_within_a_probe_of_the_dispatcher_being_ready_again(
    tmp_path: Path, children: Children
) -> None:
    pg = LocalPostgres(tmp_path / "pg", durable=True, log_path=tmp_path / "pg.log")
    pg.start()
    try:
        await apply_migrations(pg.dsn())
        _, dispatcher_url = await spawn(children, "dispatcher", pg.dsn())
        done: dict[str, float] = {}
        handlers = Handlers()

        @handlers.job("t")
        async def record(job: Job) -> None:
            done[str(job.id)] = time.monotonic()

        worker = Worker(
            dispatcher_url,
            WORKER_TOKEN,
            [QUEUE],
            handlers=handlers,
            wait_seconds=0.5,
            backoff=SLOW_BACKOFF,
        )
        running = asyncio.create_task(worker.serve())
        try:
            first = await _submit(pg.dsn())
            # Its outcome recorded, not only its handler run: an outcome still on its way
            # when PostgreSQL stops is retried after the acks' own backoff, SLOW_BACKOFF,
            # and stop() below would wait for that.
            await _until_completed(pg.dsn(), first, "the worker completes a job before the outage")

            await asyncio.to_thread(pg.stop)
            async with aiohttp.ClientSession() as http:
                await until(
                    lambda: _not_ready(http, dispatcher_url),
                    "the dispatcher reports PostgreSQL gone",
                    within=10,
                )
                await asyncio.sleep(OUTAGE_SECONDS)  # the worker's claims fail meanwhile
                await asyncio.to_thread(pg.start)
                await until(
                    lambda: _ready(http, dispatcher_url),
                    "the dispatcher is ready again",
                    within=20,
                )
            ready_at = time.monotonic()
            second = await _submit(pg.dsn())
            await until(lambda: second in done, "the worker runs a job after the outage", within=30)
            # A probe every ~1 s plus a claim: well inside the 30-60 s the backoff alone waits.
            assert done[second] - ready_at < 15.0, done[second] - ready_at
            assert not running.done()
        finally:
            await asyncio.wait_for(worker.stop(), 30)
            await running
    finally:
        pg.stop()


async def _until_completed(dsn: str, job_id: str, what: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:

        async def completed() -> bool:
            state = await conn.fetchval(
                "SELECT state::text FROM evora.jobs WHERE id = $1::uuid", job_id
            )
            return bool(state == "COMPLETED")

        await until(completed, what)
    finally:
        await conn.close()


async def _not_ready(http: aiohttp.ClientSession, url: str) -> bool:
    return not await _ready(http, url)
