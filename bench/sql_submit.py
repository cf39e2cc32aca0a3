"""Submit throughput in SQL (`evora.submit`, `evora.submit_batch`) against HTTP
(`POST /v1/jobs`, `POST /v1/jobs/batch`), in one run on one database.

    python -m bench.sql_submit [--jobs 4000] [--clients 16] [--batch 100] [--wakes 200]
                               [--not-durable]

Starts its own PostgreSQL (durable by default: fsync and synchronous_commit on), `evora api`
and `evora dispatcher` as separate processes, then submits `--jobs` jobs each way: single
submissions from `--clients` concurrent clients (each SQL submission its own transaction,
each HTTP one its own request), and batches of `--batch` from 4 clients. Prints jobs per
second for each.

Then the wake-up, measured the same way for both: a worker holds a long-poll claim on an
idle queue, and `--wakes` single jobs are submitted one at a time, alternating SQL and HTTP;
a wake is the time from the submit's return (the SQL call's commit, the HTTP answer) to the
claim's answer carrying that job. Prints p50/p95/p99 for each.
Without the SQL functions (a database migrated by an older Evora) only HTTP is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson

from bench.children import Children
from bench.evora_system import _evora_command, _free_port
from evora.embedded import LocalPostgres

BATCH_CLIENTS = 4
READY_TIMEOUT_S = 60.0
WAKE_QUEUE = "bench-wake"
# Between two wake samples: long enough for the claimer to be parked on its next long poll.
WAKE_GAP_S = 0.05


def _job(n: int) -> dict[str, Any]:
    return {"queue": "bench", "type": "bench.noop", "payload": {"n": n, "text": "x" * 64}}


async def _measure(clients: int, calls: int, call: Callable[[int], Awaitable[None]]) -> float:
    """Seconds to make `calls` calls from `clients` concurrent loops."""
    counter = iter(range(calls))

    async def loop() -> None:
        for n in counter:
            await call(n)

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(clients)))
    return time.perf_counter() - start


async def _http(url: str, token: str, args: argparse.Namespace) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=args.clients)
    async with aiohttp.ClientSession(url, headers=headers, connector=connector) as session:

        async def single(n: int) -> None:
            async with session.post("/v1/jobs", data=orjson.dumps(_job(n))) as resp:
                assert resp.status == 201, await resp.text()

        async def batch(n: int) -> None:
            body = orjson.dumps({"jobs": [_job(n * args.batch + i) for i in range(args.batch)]})
            async with session.post("/v1/jobs/batch", data=body) as resp:
                assert resp.status == 200, await resp.text()

        single_s = await _measure(args.clients, args.jobs, single)
        batch_s = await _measure(BATCH_CLIENTS, args.jobs // args.batch, batch)
    return {"single": args.jobs / single_s, "batch": args.jobs / batch_s}


async def _sql(dsn: str, args: argparse.Namespace) -> dict[str, float]:
    pool = await asyncpg.create_pool(dsn, min_size=args.clients, max_size=args.clients)
    try:

        async def single(n: int) -> None:
            job = _job(n)
            await pool.fetchval(
                "SELECT evora.submit($1, $2, $3::text::jsonb)",
                job["queue"],
                job["type"],
                orjson.dumps(job["payload"]).decode(),
            )

        async def batch(n: int) -> None:
            jobs = [_job(n * args.batch + i) for i in range(args.batch)]
            await pool.fetchval(
                "SELECT evora.submit_batch($1::text::jsonb)", orjson.dumps(jobs).decode()
            )

        single_s = await _measure(args.clients, args.jobs, single)
        batch_s = await _measure(BATCH_CLIENTS, args.jobs // args.batch, batch)
    finally:
        await pool.close()
    return {"single": args.jobs / single_s, "batch": args.jobs / batch_s}


def _percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)

    def at(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000

    return f"p50 {at(0.50):6.2f} ms   p95 {at(0.95):6.2f} ms   p99 {at(0.99):6.2f} ms"


async def _wakes(
    api: str, dispatcher: str, tokens: dict[str, str], dsn: str | None, count: int
) -> dict[str, list[float]]:
    """Wake latency per way: submit returned -> the waiting claim answered with that job."""
    arrived: dict[str, asyncio.Future[float]] = {}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def expect(job_id: str) -> asyncio.Future[float]:
        return arrived.setdefault(job_id, loop.create_future())

    async def claimer(session: aiohttp.ClientSession) -> None:
        body = orjson.dumps(
            {"worker_id": "bench-wake", "queues": [WAKE_QUEUE], "max_jobs": 1, "wait_seconds": 5}
        )
        while not stop.is_set():
            async with session.post(f"{dispatcher}/v1/claim", data=body) as resp:
                jobs = orjson.loads(await resp.read())["jobs"]
            now = time.perf_counter()
            for job in jobs:
                expect(job["id"]).set_result(now)

    conn = None if dsn is None else await asyncpg.connect(dsn)
    headers = {"Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession(headers=headers) as http,
        aiohttp.ClientSession(
            headers={**headers, "Authorization": f"Bearer {tokens['worker']}"}
        ) as worker,
    ):
        task = asyncio.create_task(claimer(worker))
        ways = ["http", "sql"] if conn is not None else ["http"]
        samples: dict[str, list[float]] = {way: [] for way in ways}
        try:
            await asyncio.sleep(0.5)  # the first long poll is parked
            for n in range(count):
                way = ways[n % len(ways)]
                if way == "sql" and conn is not None:
                    job_id = str(
                        await conn.fetchval("SELECT evora.submit($1, 'bench.noop')", WAKE_QUEUE)
                    )
                else:
                    async with http.post(
                        f"{api}/v1/jobs",
                        data=orjson.dumps({"queue": WAKE_QUEUE, "type": "bench.noop"}),
                        headers={"Authorization": f"Bearer {tokens['producer']}"},
                    ) as resp:
                        job_id = orjson.loads(await resp.read())["id"]
                returned = time.perf_counter()
                claimed = await asyncio.wait_for(expect(job_id), 10)
                samples[way].append(claimed - returned)
                await asyncio.sleep(WAKE_GAP_S)
        finally:
            stop.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if conn is not None:
                await conn.close()
    return samples


async def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url + "/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"evora api not ready after {READY_TIMEOUT_S:.0f} s")


async def _run(args: argparse.Namespace, directory: Path) -> None:
    with LocalPostgres(directory / "pg", durable=args.durable) as server:
        dsn = server.dsn()
        token = secrets.token_urlsafe(18)
        tokens = {"producer": token, "worker": secrets.token_urlsafe(18)}
        port, dispatcher_port = _free_port(), _free_port()
        env = {
            **os.environ,
            "EVORA_DATABASE_URL": dsn,
            "EVORA_TOKENS": ",".join(f"{role}:{value}" for role, value in tokens.items()),
            "EVORA_HOST": "127.0.0.1",
            "EVORA_API_PORT": str(port),
            "EVORA_DISPATCHER_PORT": str(dispatcher_port),
        }
        children = Children(directory)
        try:
            migrate = children.spawn("migrate", [*_evora_command(), "migrate"], env)
            if migrate.popen.wait() != 0:
                raise RuntimeError(f"evora migrate failed:\n{migrate.log_tail()}")
            children.spawn("api", [*_evora_command(), "api"], env)
            children.spawn("dispatcher", [*_evora_command(), "dispatcher"], env)
            url = f"http://127.0.0.1:{port}"
            dispatcher = f"http://127.0.0.1:{dispatcher_port}"
            await _wait_ready(url)
            await _wait_ready(dispatcher)
            conn = await asyncpg.connect(dsn)
            try:
                has_sql = await conn.fetchval("SELECT to_regproc('evora.submit') IS NOT NULL")
            finally:
                await conn.close()
            figures = {"http": await _http(url, token, args)}
            if has_sql:
                figures["sql"] = await _sql(dsn, args)
            wakes = await _wakes(url, dispatcher, tokens, dsn if has_sql else None, args.wakes)
        finally:
            children.stop_all()
    print(
        f"{args.jobs} jobs each way; single: {args.clients} clients; "
        f"batch: {args.batch} jobs per call, {BATCH_CLIENTS} clients; "
        f"PostgreSQL {'durable' if args.durable else 'not durable'}"
    )
    for way, rates in figures.items():
        print(
            f"{way:>4}  single {rates['single']:8.0f} jobs/s   batch {rates['batch']:8.0f} jobs/s"
        )
    print(f"wake-up of a waiting claim, {args.wakes} single submits alternating:")
    for way, samples in wakes.items():
        print(f"{way:>4}  {_percentiles(samples)}   ({len(samples)} samples)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--wakes", type=int, default=200)
    parser.add_argument("--not-durable", dest="durable", action="store_false")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evora-bench-sql-") as tmp:
        asyncio.run(_run(args, Path(tmp)))


if __name__ == "__main__":
    main()
