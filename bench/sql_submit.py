"""Submit throughput in SQL (`evora.submit`, `evora.submit_batch`) against HTTP
(`POST /v1/jobs`, `POST /v1/jobs/batch`), in one run on one database.

    python -m bench.sql_submit [--jobs 4000] [--clients 16] [--batch 100] [--not-durable]

Starts its own PostgreSQL (durable by default: fsync and synchronous_commit on) and `evora
api` as a separate process, then submits `--jobs` jobs each way: single submissions from
`--clients` concurrent clients (each SQL submission its own transaction, each HTTP one its
own request), and batches of `--batch` from 4 clients. Prints jobs per second for each.
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
        port = _free_port()
        env = {
            **os.environ,
            "EVORA_DATABASE_URL": dsn,
            "EVORA_TOKENS": f"producer:{token}",
            "EVORA_HOST": "127.0.0.1",
            "EVORA_API_PORT": str(port),
        }
        children = Children(directory)
        try:
            migrate = children.spawn("migrate", [*_evora_command(), "migrate"], env)
            if migrate.popen.wait() != 0:
                raise RuntimeError(f"evora migrate failed:\n{migrate.log_tail()}")
            children.spawn("api", [*_evora_command(), "api"], env)
            url = f"http://127.0.0.1:{port}"
            await _wait_ready(url)
            conn = await asyncpg.connect(dsn)
            try:
                has_sql = await conn.fetchval("SELECT to_regproc('evora.submit') IS NOT NULL")
            finally:
                await conn.close()
            figures = {"http": await _http(url, token, args)}
            if has_sql:
                figures["sql"] = await _sql(dsn, args)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--not-durable", dest="durable", action="store_false")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evora-bench-sql-") as tmp:
        asyncio.run(_run(args, Path(tmp)))


if __name__ == "__main__":
    main()
