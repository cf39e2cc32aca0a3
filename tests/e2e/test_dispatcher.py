"""The dispatcher end to end: restarts under working workers, NOTIFY waking a long-poll,
and long-polls whose client leaves."""

from __future__ import annotations

import asyncio
import functools
import json
import operator
import signal
import time
from collections import Counter
from typing import Any

import aiohttp
import asyncpg
import pytest

from evora import Handlers, Job, Submission
from evora.storage.jobs import JobStore
from tests.e2e.conftest import (
    WORKER_HEADERS,
    Children,
    LogRecords,
    Stack,
    free_port,
    open_stack,
    polls_waiting,
    scrape,
    spawn_dispatcher,
)


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
async def test_dispatcher_restart_while_workers_poll_loses_no_job(
    db_url: str,
    pool: asyncpg.Pool,
    store: JobStore,
    children: Children,
    worker_log: LogRecords,
    stop_signal: signal.Signals,
) -> None:
    queue = "e2e-restart"
    total = 80
    async with asyncio.timeout(60):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        async with open_stack(db_url, pool, dispatcher_url=url) as stack:
            first = await spawn_dispatcher(children, stack.http, db_url, port)

            gate = asyncio.Event()
            gate.set()
            runs: Counter[str] = Counter()
            held: set[str] = set()  # handlers waiting at the closed gate
            finished_in_outage: set[str] = set()
            outage = False
            handlers = Handlers()

            @handlers.job("e2e.work")
            async def work(job: Job) -> dict[str, int]:
                runs[job.id] += 1
                if not gate.is_set():
                    held.add(job.id)
                    await gate.wait()
                    held.discard(job.id)
                await asyncio.sleep(0.01)  # the work itself
                if outage:
                    finished_in_outage.add(job.id)
                return {"n": int(job.payload["n"])}

            worker = stack.worker(handlers, [queue], concurrency=4, wait_seconds=2.0)
            stack.start(worker)
            # A short lease: after SIGKILL a claim whose answer was lost leaves a RUNNING
            # job behind until its lease expires.
            submissions: list[Submission] = [
                {"queue": queue, "type": "e2e.work", "payload": {"n": n}, "lease_seconds": 3}
                for n in range(total)
            ]
            ids = [r.id for r in await stack.client.submit_batch(submissions)]

            async def some_completed() -> bool:
                return (await stack.states(queue))["COMPLETED"] >= total // 4

            await stack.until(some_completed, within=20, what="a quarter of the jobs done")
            # Hold the jobs now starting, so some are in flight across the outage.
            gate.clear()
            await stack.until(lambda: len(held) >= 2, within=10, what="jobs held in flight")

            first.send(stop_signal)
            await first.wait(within=20)
            outage = True
            gate.set()  # their outcomes are due while no dispatcher listens
            await stack.until(
                lambda: not held and len(finished_in_outage) >= 2,
                within=10,
                what="held jobs finished during the outage",
            )
            await stack.until(
                lambda: worker_log.saw("could not report"),
                within=10,
                what="the worker retries outcomes it could not deliver",
            )

            await spawn_dispatcher(children, stack.http, db_url, port)
            outage = False

            async def all_completed() -> bool:
                if stop_signal == signal.SIGKILL:
                    # What the sweeper does: requeue jobs whose lease ran out (a claim
                    # committed by the killed dispatcher but never delivered).
                    await store.expire_leases()
                return (await stack.states(queue))["COMPLETED"] == total

            await stack.until(all_completed, within=40, what="every job completed")

            assert await stack.states(queue) == {"COMPLETED": total}
            jobs = {job["id"]: job async for job in stack.admin.iter_jobs(queue=queue)}
            for n, job_id in enumerate(ids):
                assert jobs[job_id]["result"] == {"n": n}
            assert set(runs) == set(ids), "every job ran"
            for job_id in finished_in_outage:
                # Its outcome was sent again until the new dispatcher recorded it.
                assert jobs[job_id]["state"] == "COMPLETED"
            completions = await stack.pool.fetchval(
                "SELECT count(*) FROM evora.job_events WHERE queue = $1 AND event = 'completed'",
                queue,
            )
            assert completions == total
            if stop_signal == signal.SIGTERM:
                # A graceful stop answers or releases every claim: nothing ran twice, and
                # no job needed its lease to expire.
                assert runs == Counter(dict.fromkeys(ids, 1))
                expired = await stack.pool.fetchval(
                    "SELECT count(*) FROM evora.job_events WHERE queue = $1 AND event ="
                    " 'lease_expired'",
                    queue,
                )
                assert expired == 0


async def test_submission_wakes_an_idle_long_poll_at_once(stack: Stack) -> None:
    """A functional check that NOTIFY works end to end (api commit -> PostgreSQL NOTIFY ->
    dispatcher LISTEN -> waiting long-poll -> worker -> handler), not a benchmark."""
    queue = "e2e-notify"
    assert stack.dispatcher is not None
    dispatcher = stack.dispatcher
    handlers = Handlers()
    handler_started: dict[str, float] = {}

    @handlers.job("e2e.ping")
    async def ping(job: Job) -> str:
        handler_started[job.id] = time.monotonic()
        return "pong"

    async def metric(name: str, **labels: str) -> float:
        samples = await scrape(stack.http, stack.dispatcher_url)
        key = (name, *(f"{k}={v}" for k, v in sorted(labels.items())))
        return samples.get(key, 0.0)

    async def listening() -> bool:
        return await metric("evora_dispatcher_listener_connected") == 1

    await stack.until(listening, within=15, what="the dispatcher LISTENs")
    wait_seconds = 20.0
    stack.start(stack.worker(handlers, [queue], concurrency=1, wait_seconds=wait_seconds))

    latencies = []
    for _ in range(3):
        # The worker's long-poll is registered (it registers before its first claim, so a
        # notification during that claim is not lost) and waits.
        await stack.until(
            polls_waiting(dispatcher, queue, 1), within=15, what="the worker waits in a long-poll"
        )
        job_id = (await stack.client.submit(queue, "e2e.ping", {})).id
        submitted = time.monotonic()
        await stack.until(
            functools.partial(operator.contains, handler_started, job_id),
            within=15,
            what="the handler ran",
        )
        latencies.append(handler_started[job_id] - submitted)
        await stack.wait_for_states(queue, {"COMPLETED": len(latencies)}, within=10)

    assert max(latencies) < 5.0, latencies  # far below the 20 s wait
    # Woken by the notification, not by the fallback poll (every 2 s).
    assert await metric("evora_dispatcher_wakeups_total", cause="notify") >= 1, latencies


async def test_a_client_leaving_mid_long_poll_strands_nothing(stack: Stack) -> None:
    queue = "e2e-leaver"
    assert stack.dispatcher is not None
    dispatcher = stack.dispatcher
    claim_url = stack.dispatcher_url + "/v1/claim"

    async def claim(worker_id: str, wait: float) -> tuple[int, dict[str, Any]]:
        body = {"worker_id": worker_id, "queues": [queue], "wait_seconds": wait}
        async with (
            aiohttp.ClientSession(headers=WORKER_HEADERS) as http,
            http.post(claim_url, json=body) as response,
        ):
            return response.status, await response.json()

    leaver = asyncio.create_task(claim("leaver", 30))
    await stack.until(polls_waiting(dispatcher, queue, 1), within=10, what="the poll waits")
    leaver.cancel()  # the client goes away: its connection closes
    with pytest.raises(asyncio.CancelledError):
        await leaver
    await stack.until(
        polls_waiting(dispatcher, queue, 0), within=10, what="the dispatcher drops the poll"
    )

    job_id = (await stack.client.submit(queue, "e2e.any", {"x": 1})).id
    status, answer = await asyncio.wait_for(claim("stayer", 5), 15)
    assert status == 200
    assert [j["id"] for j in answer["jobs"]] == [job_id]
    claimed = answer["jobs"][0]
    assert claimed["attempt"] == 1
    assert claimed["worker_id"] == "stayer"
    # Nobody claimed it for the client that left.
    assert await stack.event_names(job_id) == ["submitted", "claimed"]
    samples = await scrape(stack.http, stack.dispatcher_url)
    assert samples.get(("evora_dispatcher_undeliverable_jobs_released_total",), 0) == 0


async def test_clients_leaving_as_their_job_arrives_strand_nothing(stack: Stack) -> None:
    """Each long-poll's client closes its connection right as a job for it is submitted,
    so the dispatcher sometimes claims the job for a worker that is already gone; it must
    notice and release it (the attempt not counted), never leave it RUNNING."""
    assert stack.dispatcher is not None
    dispatcher = stack.dispatcher
    queues = [f"e2e-race-{i}" for i in range(20)]
    ids: list[str] = []
    for i, queue in enumerate(queues):
        _, writer = await asyncio.open_connection("127.0.0.1", dispatcher.port)
        body = json.dumps({"worker_id": "leaver", "queues": [queue], "wait_seconds": 30})
        writer.write(
            b"POST /v1/claim HTTP/1.1\r\nHost: evora\r\n"
            + f"Authorization: {WORKER_HEADERS['Authorization']}\r\n".encode()
            + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body.encode()
        )
        await writer.drain()
        await stack.until(polls_waiting(dispatcher, queue, 1), within=10, what="the poll waits")
        submitting = asyncio.create_task(stack.client.submit(queue, "e2e.any", {"i": i}))
        for _ in range(i % 6):  # vary where in the submission the client leaves
            await asyncio.sleep(0)
        writer.close()  # closes before the job can have been committed, let alone delivered
        ids.append((await submitting).id)
        await writer.wait_closed()
        await stack.until(polls_waiting(dispatcher, queue, 0), within=10, what="poll dropped")

    async def all_pending() -> bool:
        rows = await stack.pool.fetch(
            "SELECT state::text FROM evora.jobs WHERE queue = ANY($1::text[])", queues
        )
        return len(rows) == len(queues) and {r["state"] for r in rows} == {"PENDING"}

    await stack.until(all_pending, within=10, what="no job is left RUNNING for a gone client")
    histories: Counter[tuple[str, ...]] = Counter()
    for job_id in ids:
        histories[tuple(await stack.event_names(job_id))] += 1
    assert set(histories) <= {("submitted",), ("submitted", "claimed", "released")}, histories

    async with stack.http.post(
        stack.dispatcher_url + "/v1/claim",
        json={"worker_id": "stayer", "queues": queues, "max_jobs": 50, "wait_seconds": 0},
        headers=WORKER_HEADERS,
    ) as response:
        assert response.status == 200
        claimed = (await response.json())["jobs"]
    assert sorted(j["id"] for j in claimed) == sorted(ids)
    assert {j["attempt"] for j in claimed} == {1}
