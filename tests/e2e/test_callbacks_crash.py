"""Suspended work through kill -9 of every service (docs/callbacks.md, docs/jobs-that-wait.md):
jobs suspend on callbacks and parents wait for their children; `evora api`, `evora dispatcher`,
`evora sweeper` and `evora projector` are all SIGKILLed while children run, and started again;
then each of them dies once more while the children finish, the callbacks are resolved
through the api and some time out under a new sweeper. A suspended or waiting job holds
nothing a crash could strand: each runs exactly once more and completes (or goes where its
`on_timeout` says), every child runs once, the read models equal the tables once the
projector catches up, and the teardown audit passes."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import aiohttp
import asyncpg
from pymongo.asynchronous.database import AsyncDatabase

import evora
from evora import Client, Handlers, Worker
from evora.readmodels.layout import CONTROL, Document, checkpoint_id
from tests.e2e.conftest import FAST, Child, Children, free_port, spawn_service
from tests.polling import until
from tests.projector.test_projection import assert_matches_truth
from tests.servers import PRODUCER_TOKEN, WORKER_TOKEN

QUEUE = "e2e-callbacks"
RESOLVED = 4
RESUMING = 2  # time out with on_timeout="resume"
DEAD_LETTERED = 1  # time out with on_timeout="dlq"
TIMEOUT_SECONDS = 5.0
PARENTS = 3
CHILDREN = 4  # of each parent
CONCURRENCY = 8

SERVICES = ("api", "dispatcher", "sweeper", "projector")


async def test_suspended_and_waiting_jobs_survive_kill_9_of_every_service(
    db_url: str,
    mongo_url: str,
    mongo_db_name: str,
    children: Children,
    pool: asyncpg.Pool,
    mongo: AsyncDatabase[Document],
) -> None:
    started = time.monotonic()
    ports = {service: free_port() for service in SERVICES}
    callbacks: dict[str, str] = {}  # job id -> callback id
    spawned: dict[str, list[str]] = {}  # parent id -> its children's ids
    runs: dict[str, list[Any]] = {}  # job id -> what each run saw: callback, results or None
    gate = asyncio.Event()  # children run until it opens

    handlers = Handlers()

    @handlers.job("approve")
    async def approve(job: evora.Job) -> Any:
        runs.setdefault(job.id, []).append(None if job.callback is None else dict(job.callback))
        if job.callback is None:
            on_timeout = job.payload["on_timeout"]
            callbacks[job.id] = await job.suspend(
                timeout_seconds=3600 if on_timeout == "fail" else TIMEOUT_SECONDS,
                on_timeout=on_timeout,
            )
            return None
        return {"payload": job.callback["payload"], "timed_out": job.callback["timed_out"]}

    @handlers.job("fan_out")
    async def fan_out(job: evora.Job) -> Any:
        runs.setdefault(job.id, []).append(dict(job.dependency_results))
        if not job.dependency_results:
            spawned[job.id] = await job.spawn_children(
                [{"queue": QUEUE, "type": "square", "payload": {"n": n}} for n in range(CHILDREN)]
            )
            return None
        return {"sum": sum(result["square"] for result in job.dependency_results.values())}

    @handlers.job("square")
    async def square(job: evora.Job) -> Any:
        runs.setdefault(job.id, []).append(None)
        await gate.wait()
        return {"square": job.payload["n"] ** 2}

    async def states(type_: str) -> dict[str, int]:
        rows = await pool.fetch(
            "SELECT state::text, count(*) AS n FROM evora.jobs WHERE queue = $1 AND type = $2"
            " GROUP BY 1",
            QUEUE,
            type_,
        )
        return {r["state"]: r["n"] for r in rows}

    async def projected() -> bool:
        newest = await pool.fetchval("SELECT max(seq) FROM evora.job_events")
        checkpoint = await mongo[CONTROL].find_one({"_id": checkpoint_id(1)})
        return checkpoint is not None and checkpoint["max_seq"] == newest

    async with aiohttp.ClientSession() as http:
        mongo_env = {"EVORA_MONGO_URL": mongo_url, "EVORA_MONGO_DB": mongo_db_name}

        async def spawn(name: str) -> Child:
            return await spawn_service(children, http, db_url, name, ports[name], **mongo_env)

        async def kill(name: str) -> None:
            services[name].send(signal.SIGKILL)
            await services[name].wait(10)

        async def start(*names: str) -> None:
            for name, child in zip(names, await asyncio.gather(*map(spawn, names)), strict=True):
                services[name] = child

        async def restart(name: str) -> None:
            await kill(name)
            await start(name)

        services: dict[str, Child] = {}
        await start(*SERVICES)
        api_url = f"http://127.0.0.1:{ports['api']}"
        worker = Worker(
            f"http://127.0.0.1:{ports['dispatcher']}",
            WORKER_TOKEN,
            [QUEUE],
            handlers=handlers,
            concurrency=CONCURRENCY,
            wait_seconds=1.0,
            backoff=FAST,
            request_timeout=5.0,
        )
        serving = asyncio.create_task(worker.serve())
        try:
            timeouts = ["fail"] * RESOLVED + ["resume"] * RESUMING + ["dlq"] * DEAD_LETTERED
            async with Client(api_url, PRODUCER_TOKEN, retry_backoff=FAST) as producer:
                ids = [
                    (await producer.submit(QUEUE, "approve", {"on_timeout": t})).id
                    for t in timeouts
                ]
                parents = [(await producer.submit(QUEUE, "fan_out")).id for _ in range(PARENTS)]

            async def all_waiting() -> bool:
                return (
                    len(callbacks) == len(ids)
                    and await states("approve") == {"SUSPENDED": len(ids)}
                    and await states("fan_out") == {"WAITING": PARENTS}
                    # every slot taken, so no claim is on its way when the dispatcher dies
                    and await states("square")
                    == {"RUNNING": CONCURRENCY, "PENDING": PARENTS * CHILDREN - CONCURRENCY}
                )

            await until(all_waiting, "every job suspended or waiting, children running", within=60)

            # Every service dies at once, children running; the sweeper stays down until the
            # callbacks' timeouts have passed, so a new one is what settles them.
            for name in SERVICES:
                await kill(name)
            # nothing of the killed processes holds the jobs: they wait on, lease-free
            held = await pool.fetchval(
                "SELECT count(*) FROM evora.jobs WHERE queue = $1"
                " AND state IN ('SUSPENDED', 'WAITING') AND lease_expires_at IS NULL",
                QUEUE,
            )
            assert held == len(ids) + PARENTS
            await start("api", "dispatcher", "projector")
            # nothing moves while the children's gate is shut and no sweeper runs: the new
            # projector's counts of the suspended, waiting and running jobs are the tables'
            await until(projected, "the restarted projector caught up", within=60)
            await assert_matches_truth(pool, mongo)

            # Each dies once more while the work moves: the dispatcher as the children finish
            # (killed before their outcomes go out: the worker reports them to the new one),
            # the api between two resolutions (the sender repeats the one it lost), the
            # projector while both write events.
            first_resolved = asyncio.Event()

            async def resolve() -> None:
                # a sender repeats a resolution until answered: the api may die under it
                async with Client(api_url, retries=60, retry_backoff=FAST) as sender:
                    for job_id in ids[:RESOLVED]:
                        await sender.resolve_callback(callbacks[job_id], {"for": job_id})
                        first_resolved.set()

            async def api_dies_between_resolutions() -> None:
                await first_resolved.wait()
                await restart("api")

            resolving = asyncio.create_task(resolve())
            gate.set()
            await asyncio.gather(
                restart("dispatcher"), api_dies_between_resolutions(), restart("projector")
            )
            await resolving

            async def timeouts_due() -> bool:
                due = await pool.fetchval(
                    "SELECT count(*) FROM evora.callbacks WHERE outcome IS NULL"
                    " AND timeout_at <= evora.clock_now()"
                )
                return bool(due == RESUMING + DEAD_LETTERED)

            await until(timeouts_due, "the timeouts passed, no sweeper running", within=30)
            await start("sweeper")

            async def all_ended() -> bool:
                return (
                    await states("approve")
                    == {"COMPLETED": RESOLVED + RESUMING, "DLQ": DEAD_LETTERED}
                    and await states("fan_out") == {"COMPLETED": PARENTS}
                    and await states("square") == {"COMPLETED": PARENTS * CHILDREN}
                )

            await until(all_ended, "every job ended", within=90)
        finally:
            await worker.stop()
            await serving
        for name, child in services.items():
            assert child.running, f"{name} exited:\n{child.output()}"

    async def event_names(job_id: str) -> list[str]:
        rows = await pool.fetch(
            "SELECT event FROM evora.job_events WHERE job_id = $1::uuid ORDER BY seq", job_id
        )
        return [r["event"] for r in rows]

    for job_id, on_timeout in zip(ids, timeouts, strict=True):
        events = await event_names(job_id)
        if on_timeout == "dlq":
            assert runs[job_id] == [None]
            assert events == ["submitted", "claimed", "suspended", "dead_lettered"]
            continue
        [first, second] = runs[job_id]  # exactly one run more after the suspend
        assert first is None
        timed_out = on_timeout == "resume"
        assert second["timed_out"] is timed_out
        assert second["payload"] == (None if timed_out else {"for": job_id})
        assert events == ["submitted", "claimed", "suspended", "resumed", "claimed", "completed"]

    squares = {n * n for n in range(CHILDREN)}
    for parent in parents:
        [first, second] = runs[parent]  # exactly one run more, with every child's result
        assert first == {}
        assert set(second) == set(spawned[parent])
        assert {result["square"] for result in second.values()} == squares
        assert await pool.fetchval("SELECT result FROM evora.jobs WHERE id = $1::uuid", parent) == {
            "sum": sum(squares)
        }
        assert await event_names(parent) == [
            "submitted",
            "claimed",
            "awaiting_children",
            "dependencies_met",
            "claimed",
            "completed",
        ]
        for square_id in spawned[parent]:
            assert runs[square_id] == [None]  # each child ran once, through every death
            assert await event_names(square_id) == ["submitted", "claimed", "completed"]

    # the read models equal the tables once the restarted projector caught up
    await until(projected, "the projector caught up", within=60)
    await assert_matches_truth(pool, mongo)
    print(
        f"kill -9 of every service, suspended and waiting jobs: {time.monotonic() - started:.1f} s"
    )
