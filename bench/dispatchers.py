"""Drain throughput with 1, 2 and 3 dispatcher processes on the same PostgreSQL.

Not a test: it measures and prints. It starts its own PostgreSQL (`LocalPostgres`,
default durability) in a temporary directory and, per dispatcher count and round: a fresh
database with the migrations of the `evora` package on the path, `--jobs` jobs submitted
(batches of 1,000, as the api stores them), N `evora dispatcher` processes and a fixed
`--workers` `evora worker` processes (the example worker's `demo.echo` handler) spread
over them round-robin, so only the number of dispatchers changes between the rows. It
reports the rate between 10% and 90% completed (worker start-up and the tail left out)
and the CPU seconds per 1,000 jobs of the dispatchers and of PostgreSQL over the whole
drain.

    python -m bench.dispatchers --jobs 20000 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

import aiohttp
import asyncpg

from bench import procstats
from bench.system import source_path
from evora.embedded import LocalPostgres
from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations

ROOT = Path(__file__).resolve().parents[1]

QUEUE = "demo"
TOKEN = "bench-worker-token"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def evora(*args: str) -> list[str]:
    return [sys.executable, "-m", "evora_services.cli", *args]


def env(dsn: str, **variables: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("EVORA_")}
    return {
        **base,
        "PYTHONPATH": source_path(ROOT),
        "EVORA_DATABASE_URL": dsn,
        "EVORA_TOKENS": f"worker:{TOKEN}",
        "EVORA_HOST": "127.0.0.1",
        "EVORA_LOG_LEVEL": "WARNING",
        **variables,
    }


Process = asyncio.subprocess.Process


async def spawn(command: list[str], environment: dict[str, str], out: IO[bytes]) -> Process:
    return await asyncio.create_subprocess_exec(
        *command, env=environment, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out
    )


async def wait_ready(http: aiohttp.ClientSession, url: str, process: Process) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.returncode is not None:
            raise RuntimeError(f"{url}: the dispatcher exited")
        try:
            async with http.get(url + "/readyz") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} never became ready")


async def stop(processes: list[Process]) -> None:
    for process in processes:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()


async def one_round(
    args: argparse.Namespace, pg: LocalPostgres, postmaster: int, dispatchers: int, log: Path
) -> tuple[float, float, float]:
    """(jobs/s between 10% and 90% completed, dispatcher and PostgreSQL CPU s/1000 jobs)."""
    name = f"bench_{dispatchers}_{time.monotonic_ns()}"
    admin = await asyncpg.connect(pg.dsn("postgres"))
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    dsn = pg.dsn(name)
    await apply_migrations(dsn)
    pool = await create_pool(dsn, min_size=1, max_size=2)
    store = JobStore(pool)
    started: list[Process] = []
    try:
        for start in range(0, args.jobs, 1000):
            size = min(1000, args.jobs - start)
            await store.submit_batch(
                [
                    JobSubmission(queue=QUEUE, type="demo.echo", payload={"n": start + i})
                    for i in range(size)
                ]
            )
        with log.open("ab") as out:
            ports = [free_port() for _ in range(dispatchers)]
            urls = [f"http://127.0.0.1:{port}" for port in ports]
            servers = [
                await spawn(evora("dispatcher"), env(dsn, EVORA_DISPATCHER_PORT=str(p)), out)
                for p in ports
            ]
            started += servers
            async with aiohttp.ClientSession() as http:
                for url, server in zip(urls, servers, strict=True):
                    await wait_ready(http, url, server)
            cpu0 = sum(procstats.cpu_seconds(s.pid) or 0.0 for s in servers)
            pg0 = procstats.cluster_cpu_seconds(postmaster)
            for i in range(args.workers):
                command = [
                    *evora("worker", "examples.worker_example"),
                    *("--url", urls[i % dispatchers], "--token", TOKEN, "--queues", QUEUE),
                    *("--concurrency", str(args.concurrency)),
                ]
                started.append(await spawn(command, env(dsn), out))
            marks: dict[float, float] = {}
            done = 0
            while done < args.jobs:
                await asyncio.sleep(0.05)
                done = await pool.fetchval(
                    "SELECT count(*) FROM evora.jobs WHERE state = 'COMPLETED'"
                )
                for fraction in (0.1, 0.9):
                    if fraction not in marks and done >= fraction * args.jobs:
                        marks[fraction] = time.monotonic()
            cpu = sum(procstats.cpu_seconds(s.pid) or 0.0 for s in servers) - cpu0
            pg_cpu = procstats.cluster_cpu_seconds(postmaster) - pg0
    finally:
        await stop(started)
        await store.close()
        await pool.close()
    rate = 0.8 * args.jobs / (marks[0.9] - marks[0.1])
    return rate, cpu / args.jobs * 1000, pg_cpu / args.jobs * 1000


async def run(args: argparse.Namespace, pg: LocalPostgres, postmaster: int, log: Path) -> None:
    print(f"{args.jobs} jobs, {args.workers} worker processes x concurrency {args.concurrency}")
    print("dispatchers  jobs/s (median, all rounds)      dispatcher CPU s/1k  PostgreSQL CPU s/1k")
    for dispatchers in args.dispatchers:
        rows = [await one_round(args, pg, postmaster, dispatchers, log) for _ in range(args.rounds)]
        rates = [r[0] for r in rows]
        print(
            f"{dispatchers:>11}  {statistics.median(rates):7.0f} "
            f"({', '.join(f'{r:.0f}' for r in rates)})".ljust(45)
            + f"{statistics.median(r[1] for r in rows):8.2f}"
            + f"{statistics.median(r[2] for r in rows):21.2f}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=3, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=32, help="per worker process")
    parser.add_argument("--dispatchers", type=int, nargs="+", default=[1, 2, 3])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evora-dispatchers-") as tmp:
        data_dir = Path(tmp) / "pgdata"
        with LocalPostgres(data_dir, durable=True, log_path=Path(tmp) / "postgres.log") as pg:
            postmaster = procstats.postmaster_pid(data_dir)
            assert postmaster is not None
            asyncio.run(run(args, pg, postmaster, Path(tmp) / "children.log"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
