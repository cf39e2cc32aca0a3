"""Evora's runner process (see `bench.runnerkit` for the modes): the producer is an
`evora.Client` on the api (`POST /v1/jobs/batch`, `POST /v1/jobs`), the worker an
`evora.Worker` on the dispatcher with the SDK's defaults except concurrency 100, so that
one claim asks for up to 100 jobs; outcomes go back in batches (the SDK's ack batching).
`--prefetch N` sets the worker's `prefetch` (system `evora-prefetch`: a tuned
configuration, as graphile-worker's local queue is, never the default).

    python -m bench.evora_runner --api URL --dispatcher URL --producer-token T \
        --worker-token T MODE ...
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from bench.runnerkit import JOB_TYPE, QUEUE, parse_args, ready, run_mode
from evora import loops
from evora.sdk import worker as worker_module
from evora.sdk.client import Client
from evora.sdk.handlers import Handlers, Job
from evora.sdk.worker import Worker

WORKER_CONCURRENCY = 100


class EvoraRunner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.client = Client(args.api, args.producer_token)

    async def setup(self) -> None:
        """Nothing: the harness runs `evora migrate`, as a deployment does."""

    async def enqueue_batch(self, indices: range) -> None:
        # Ids only, as pgqueuer's batch enqueue answers: the producer keeps no job.
        await self.client.submit_batch(
            [{"queue": QUEUE, "type": JOB_TYPE, "payload": {"i": i}} for i in indices],
            return_jobs=False,
        )

    async def enqueue_one(self, i: int) -> None:
        await self.client.submit(QUEUE, JOB_TYPE, {"i": i})

    async def work(self, handle: Callable[[Any], Awaitable[None]], stop: asyncio.Event) -> None:
        handlers = Handlers()

        @handlers.job(JOB_TYPE)
        async def noop(job: Job) -> None:
            await handle(job.payload)

        worker = Worker(
            self.args.dispatcher,
            self.args.worker_token,
            [QUEUE],
            WORKER_CONCURRENCY,
            handlers=handlers,
            prefetch=self.args.prefetch,
        )
        # This process is the worker's, as under `Worker.run()` (what `evora worker` and the
        # README's workers run), which settles the collector before serving. Asked of the
        # worker's module, not imported: a variant (`--evora-variant`) whose run() leaves the
        # collector as it is must not find this checkout's `evora.collector` through the
        # editable install.
        collector = getattr(worker_module, "collector", None)
        if collector is not None:
            collector.settle()
        serving = asyncio.create_task(worker.serve())
        ready()
        await stop.wait()
        await worker.stop()
        await serving

    async def close(self) -> None:
        await self.client.close()


def _system_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api", required=True)
    parser.add_argument("--dispatcher", required=True)
    parser.add_argument("--producer-token", required=True)
    parser.add_argument("--worker-token", required=True)
    parser.add_argument("--prefetch", type=int, default=0)


async def _make(args: argparse.Namespace) -> EvoraRunner:
    return EvoraRunner(args)


def main() -> None:
    args = parse_args(__doc__.split("\n", 1)[0], _system_args)
    loops.run(run_mode(args, lambda: _make(args)))


if __name__ == "__main__":
    main()
