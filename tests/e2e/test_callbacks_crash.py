"""Suspended work through kill -9 of every service (docs/callbacks.md): jobs suspend on
callbacks; `evora api`, `evora dispatcher` and `evora sweeper` are SIGKILLed and started again;
then the callbacks are resolved through the new api, and some time out under the new sweeper.
A suspended job holds nothing a crash could strand: each runs exactly once more and
completes, and the teardown audit passes."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import aiohttp
import asyncpg

import evora
from evora import Client, Handlers, Worker
from tests.e2e.conftest import FAST, Child, Children, free_port, spawn_service
from tests.polling import until
from tests.servers import PRODUCER_TOKEN, WORKER_TOKEN

QUEUE = "e2e-callbacks"
RESOLVED = 6
TIMING_OUT = 3
TIMEOUT_SECONDS = 4.0


async def test_suspended_jobs_survive_kill_9_of_every_service(
    db_url: str, children: Children, pool: asyncpg.Pool
) -> None:
    ports = {service: free_port() for service in ("api", "dispatcher", "sweeper")}
    callbacks: dict[str, str] = {}  # job id -> callback id
    runs: dict[str, list[Any]] = {}  # job id -> what each run saw of its callback

    handlers = Handlers()

    @handlers.job("approve")
    async def approve(job: evora.Job) -> Any:
        runs.setdefault(job.id, []).append(None if job.callback is None else dict(job.callback))
        if job.callback is None:
            short = job.payload["timing_out"]
            callbacks[job.id] = await job.suspend(
                timeout_seconds=TIMEOUT_SECONDS if short else 3600,
                on_timeout="resume" if short else "fail",
            )
            return None
        return {"payload": job.callback["payload"], "timed_out": job.callback["timed_out"]}

    async with aiohttp.ClientSession() as http:
        services: dict[str, Child] = {
            name: await spawn_service(children, http, db_url, name, port)
            for name, port in ports.items()
        }
        api_url = f"http://127.0.0.1:{ports['api']}"
        worker = Worker(
            f"http://127.0.0.1:{ports['dispatcher']}",
            WORKER_TOKEN,
            [QUEUE],
            handlers=handlers,
            concurrency=4,
            wait_seconds=1.0,
            backoff=FAST,
            request_timeout=5.0,
        )
        serving = asyncio.create_task(worker.serve())
        try:
            async with Client(api_url, PRODUCER_TOKEN, retry_backoff=FAST) as producer:
                ids = [
                    (await producer.submit(QUEUE, "approve", {"timing_out": n >= RESOLVED})).id
                    for n in range(RESOLVED + TIMING_OUT)
                ]

            async def all_suspended() -> bool:
                states = await pool.fetch(
                    "SELECT state::text FROM evora.jobs WHERE queue = $1", QUEUE
                )
                return len(callbacks) == len(ids) and {r["state"] for r in states} == {"SUSPENDED"}

            await until(all_suspended, "every job suspended", within=60)

            for child in services.values():
                child.send(signal.SIGKILL)
                await child.wait(10)
            # nothing of the killed processes holds the jobs: they wait on, lease-free
            held = await pool.fetchval(
                "SELECT count(*) FROM evora.jobs WHERE queue = $1 AND state = 'SUSPENDED'"
                " AND lease_expires_at IS NULL",
                QUEUE,
            )
            assert held == len(ids)
            for name, port in ports.items():
                services[name] = await spawn_service(children, http, db_url, name, port)

            async with Client(api_url) as sender:  # no token: the callback ids are enough
                for job_id in ids[:RESOLVED]:
                    await sender.resolve_callback(callbacks[job_id], {"for": job_id})

            async def all_completed() -> bool:
                done = await pool.fetchval(
                    "SELECT count(*) FROM evora.jobs WHERE queue = $1 AND state = 'COMPLETED'",
                    QUEUE,
                )
                return bool(done == len(ids))

            await until(all_completed, "every job completed", within=90)
        finally:
            await worker.stop()
            await serving
        assert all(child.running for child in services.values())

    for n, job_id in enumerate(ids):
        [first, second] = runs[job_id]  # exactly one run more after the suspend
        assert first is None
        timed_out = n >= RESOLVED
        assert second["timed_out"] is timed_out
        assert second["payload"] == (None if timed_out else {"for": job_id})
        events = await pool.fetch(
            "SELECT event FROM evora.job_events WHERE job_id = $1::uuid ORDER BY seq", job_id
        )
        assert [e["event"] for e in events] == [
            "submitted",
            "claimed",
            "suspended",
            "resumed",
            "claimed",
            "completed",
        ]
