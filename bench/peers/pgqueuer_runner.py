"""pgqueuer's runner process (modes: `bench.runnerkit`), run by the interpreter of the
benchmark's cache venv where pgqueuer is installed (see `bench.peers.install`).

Producer: `Queries.enqueue` with lists (one statement for a batch of 1,000) on one
connection; single jobs on a 10-connection pool (as many as graphile-worker's producer).
Worker: one `QueueManager` on one connection (pgqueuer's usual set-up) with batch_size 100,
its tuned setting; every other setting is pgqueuer's default. On uvloop, as its command line
(`pgq run`) runs it.

    python -m bench.peers.pgqueuer_runner --dsn DSN MODE ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import uvloop
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver  # type: ignore[import-not-found]
from pgqueuer.models import Job  # type: ignore[import-not-found]
from pgqueuer.qm import QueueManager  # type: ignore[import-not-found]
from pgqueuer.queries import Queries  # type: ignore[import-not-found]

from bench.runnerkit import JOB_TYPE, parse_args, ready, run_mode

BATCH_SIZE = 100
PRODUCER_POOL = 10


class PgqueuerRunner:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.pool: asyncpg.Pool | None = None
        self.conn: asyncpg.Connection | None = None
        self.pool_queries: Any = None

    async def _queries(self) -> Any:
        if self.conn is None:
            self.conn = await asyncpg.connect(self.dsn)
        return Queries(AsyncpgDriver(self.conn))

    async def setup(self) -> None:
        await (await self._queries()).install()

    async def enqueue_batch(self, indices: range) -> None:
        queries = await self._queries()
        await queries.enqueue(
            [JOB_TYPE] * len(indices),
            [json.dumps({"i": i}).encode() for i in indices],
            [0] * len(indices),
        )

    async def open_pool(self) -> None:
        """The single-job producer's pool, opened before the first job is offered."""
        self.pool = await asyncpg.create_pool(
            self.dsn, min_size=PRODUCER_POOL, max_size=PRODUCER_POOL
        )
        self.pool_queries = Queries(AsyncpgPoolDriver(self.pool))

    async def enqueue_one(self, i: int) -> None:
        await self.pool_queries.enqueue(JOB_TYPE, json.dumps({"i": i}).encode(), 0)

    async def work(self, handle: Callable[[Any], Awaitable[None]], stop: asyncio.Event) -> None:
        qm = QueueManager(await self._queries())

        @qm.entrypoint(JOB_TYPE)  # type: ignore[untyped-decorator]
        async def noop(job: Job) -> None:
            await handle(json.loads(job.payload))

        serving = asyncio.create_task(qm.run(batch_size=BATCH_SIZE))
        ready()
        await stop.wait()
        qm.shutdown.set()
        await serving

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        if self.conn is not None:
            await self.conn.close()


def _system_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dsn", required=True)


async def _make(args: argparse.Namespace) -> PgqueuerRunner:
    runner = PgqueuerRunner(args.dsn)
    if args.mode == "offer":
        await runner.open_pool()
    return runner


def main() -> None:
    args = parse_args(__doc__.split("\n", 1)[0], _system_args)
    uvloop.run(run_mode(args, lambda: _make(args)))


if __name__ == "__main__":
    main()
