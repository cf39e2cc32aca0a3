"""Drain throughput of one TypeScript SDK worker process next to one Python SDK worker
process, on the same Evora deployment (`evora migrate`, then the four services as separate
processes on a durable embedded PostgreSQL, as `python -m bench` runs them).

For each worker in turn: N no-op jobs are batch-enqueued (1000 per request) into a queue of
their own, then one worker process (concurrency 100, the SDK's other defaults) is started
and timed from the moment it says it is claiming (READY) until PostgreSQL shows every job
COMPLETED. Prints jobs/s, and the worker process's CPU seconds and peak RSS.

    python -m bench.typescript_worker [--jobs 20000] [--concurrency 100] [--rounds 1]

Needs Node.js >= 20 and npm (sdks/typescript is installed and compiled on first use).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from bench import procstats
from bench.children import Child, Children
from bench.cluster import Cluster
from bench.evora_system import EvoraSystem
from evora import loops
from evora.sdk.client import Client

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "sdks" / "typescript"
JOB_TYPE = "bench_noop"
ENQUEUE_BATCH = 1000
DRAIN_TIMEOUT_S = 600.0

# The Python worker process: the same shape as the TypeScript one (tools/drain-worker.ts).
PYTHON_WORKER = """
import sys
from evora import Handlers, Job, Worker
url, token, queue, job_type, concurrency = sys.argv[1:6]
handlers = Handlers()
@handlers.job(job_type)
async def noop(job: Job) -> None:
    return None
worker = Worker(url, token, [queue], int(concurrency), handlers=handlers)
print("READY", flush=True)
worker.run()
"""


@dataclass(frozen=True)
class Drain:
    worker: str
    jobs: int
    seconds: float
    cpu_seconds: float
    peak_rss_mib: float

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    def line(self) -> str:
        return (
            f"{self.worker:<11} {self.jobs:>7} jobs in {self.seconds:6.2f} s = "
            f"{self.rate:8.0f} jobs/s   worker CPU {self.cpu_seconds:5.2f} s, "
            f"peak RSS {self.peak_rss_mib:5.1f} MiB"
        )


def build_typescript() -> str:
    """The node binary, with the package installed and compiled."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        sys.exit("Node.js >= 20 and npm are needed (bash scripts/test.sh installs them)")
    if not (PACKAGE / "node_modules" / "typescript").exists():
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=PACKAGE, check=True)
    subprocess.run([node, "node_modules/typescript/bin/tsc", "-p", "."], cwd=PACKAGE, check=True)
    return node


async def enqueue(client: Client, queue: str, jobs: int) -> None:
    for start in range(0, jobs, ENQUEUE_BATCH):
        size = min(ENQUEUE_BATCH, jobs - start)
        await client.submit_batch(
            [{"queue": queue, "type": JOB_TYPE, "payload": {"i": start + i}} for i in range(size)]
        )


async def completed(conn: asyncpg.Connection, queue: str) -> int:
    count: int = await conn.fetchval(
        "SELECT count(*) FROM evora.jobs WHERE queue = $1 AND state = 'COMPLETED'", queue
    )
    return count


async def drain(
    system: EvoraSystem,
    children: Children,
    dsn: str,
    worker: str,
    argv: list[str],
    jobs: int,
    concurrency: int,
    extra: Sequence[str] = (),
) -> Drain:
    queue = f"drain-{worker}-{int(time.time() * 1000)}"
    async with Client(system.urls["api"], system.tokens["producer"]) as client:
        await enqueue(client, queue, jobs)
    args = [system.urls["dispatcher"], system.tokens["worker"], queue, JOB_TYPE, str(concurrency)]
    args += extra  # a worker's own arguments after the common ones
    conn = await asyncpg.connect(dsn)
    child: Child | None = None
    try:
        child = children.spawn(f"{worker}-{queue}", [*argv, *args], system.runner_env())
        await child.wait_ready_line()
        began = time.monotonic()
        while await completed(conn, queue) < jobs:
            if not child.alive():
                raise child.failed("exited while draining")
            if time.monotonic() - began > DRAIN_TIMEOUT_S:
                raise child.failed(f"did not drain {jobs} jobs in {DRAIN_TIMEOUT_S:.0f} s")
            await asyncio.sleep(0.02)
        seconds = time.monotonic() - began
        cpu = child.cpu()
        rss = child.peak_rss_kib() / 1024
        return Drain(worker, jobs, seconds, cpu, rss)
    finally:
        await conn.close()
        if child is not None:
            child.stop()


@dataclass(frozen=True)
class Deployment:
    """The Evora that `measure` drains on: its services started, and its database."""

    system: EvoraSystem
    children: Children
    dsn: str


@contextmanager
def deployment() -> Iterator[Deployment]:
    """Evora as `python -m bench` runs it, on a durable PostgreSQL of its own in a temporary
    directory; everything stopped and removed at the end."""
    with (
        tempfile.TemporaryDirectory(prefix="evora-ts-bench-") as tmp,
        Cluster(Path(tmp)) as cluster,
    ):
        children = Children(Path(tmp))
        try:
            dsn = loops.run(cluster.fresh_database("tsbench"))
            system = EvoraSystem(children, cluster.mongo_url)
            loops.run(system.start(dsn, "tsbench"))
            yield Deployment(system, children, dsn)
        finally:
            children.stop_all()


async def measure(
    args: argparse.Namespace,
    on: Deployment,
    workers: dict[str, list[str]],
    extra: Mapping[str, list[str]] | None = None,
    *,
    alternate: bool = False,
) -> list[Drain]:
    """Drains with each of `workers` in turn, `args.rounds` times (interleaved); `extra`:
    arguments of a worker's own, after the ones every worker gets. `alternate` reverses the
    order every other round, so no worker always drains first (on the stack still warming
    up) or last (on a table grown by the others' jobs). Each drain has a queue of its own, so
    one deployment serves any number of these."""
    results: list[Drain] = []
    for round in range(args.rounds):
        order = list(workers.items())
        for name, argv in reversed(order) if alternate and round % 2 else order:
            result = await drain(
                on.system,
                on.children,
                on.dsn,
                name,
                argv,
                args.jobs,
                args.concurrency,
                (extra or {}).get(name, []),
            )
            print(result.line(), flush=True)
            results.append(result)
    return results


def main(args: argparse.Namespace) -> None:
    node = build_typescript()
    node_version = subprocess.run([node, "--version"], capture_output=True, text=True)
    workers = {
        "python": [sys.executable, "-c", PYTHON_WORKER],
        "typescript": [node, str(PACKAGE / "dist" / "tools" / "drain-worker.js")],
    }
    with deployment() as on:
        results = loops.run(measure(args, on, workers))
    print(
        f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {procstats.cpu_model()}, "
        f"{procstats.memory_total_gib():.0f} GiB, Python {platform.python_version()}, "
        f"Node {node_version.stdout.strip()}"
    )
    for name in workers:
        rates = [r.rate for r in results if r.worker == name]
        print(f"{name:<11} best {max(rates):8.0f} jobs/s over {len(rates)} rounds")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    main(parser.parse_args())
