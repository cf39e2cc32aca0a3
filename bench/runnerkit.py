"""What every Python runner process shares (Evora's and pgqueuer's): the command line, the
three modes and their JSON output. Standard library only: pgqueuer's runner imports it from
an interpreter without Evora. `bench/peers/graphile_runner.mjs` mirrors it in Node.

Modes (one per process):

- `setup`: installs the system's schema where the runner is the one to do it.
- `enqueue --count N --batch B --out F`: N jobs through the system's batch API, B per call,
  one call at a time; writes `{"t_start", "t_end", "count"}` (wall clock, seconds).
- `offer --rate R --seconds S --first K --out F`: open loop, job K+j is sent at t0 + j/R
  whether or not earlier calls have returned; writes `{"sent": [[i, t_call, t_return], ...]}`.
- `work --out F`: prints `READY` once set up, runs the system's worker with a no-op handler
  that records `time.time()` and the payload's `i` at its start, and on SIGTERM stops
  gracefully and writes `{"starts": [[i, t], ...]}`.

Every output also has the CPU seconds the mode itself used, `cpu_seconds` (starting the
process and importing left out), and the process's peak RSS `maxrss_kib`.

Every job's payload is `{"i": <sequence number>}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from array import array
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

JOB_TYPE = "bench_noop"
QUEUE = "bench"
READY_LINE = "READY"


class Runner(Protocol):
    """What a system's runner supplies; `run_mode` does the rest."""

    async def setup(self) -> None: ...

    async def enqueue_batch(self, indices: range) -> None: ...

    async def enqueue_one(self, i: int) -> None: ...

    async def work(self, handle: Callable[[Any], Awaitable[None]], stop: asyncio.Event) -> None:
        """Run the worker until `stop` is set, every handler being `await handle(payload)`
        (which records the start and lasts the workload's handler time); print `READY`
        (see `ready`) once claiming."""
        ...

    async def close(self) -> None: ...


def peak_rss_kib() -> int:
    """VmHWM of this process. Not getrusage's ru_maxrss: Linux carries that across exec, so
    a process started by a larger one reports at least its parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def ready() -> None:
    print(READY_LINE, flush=True)


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


async def _enqueue(runner: Runner, count: int, batch: int) -> dict[str, Any]:
    t_start = time.time()
    for first in range(0, count, batch):
        await runner.enqueue_batch(range(first, min(first + batch, count)))
    return {"t_start": t_start, "t_end": time.time(), "count": count}


async def _offer(runner: Runner, rate: float, seconds: float, first: int) -> dict[str, Any]:
    # Flat arrays, 24 bytes a job, and no finished call kept: a long offer (the pressure run's
    # 13 minutes, a 30-minute soak) must not grow the producer by a list and a task per job.
    sent = array("d")
    pending: set[asyncio.Task[None]] = set()
    failed: list[BaseException] = []

    async def one(i: int) -> None:
        t_call = time.time()
        await runner.enqueue_one(i)
        sent.extend((i, t_call, time.time()))

    def done(task: asyncio.Task[None]) -> None:
        pending.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            failed.append(error)

    total = round(rate * seconds)
    t0 = time.monotonic()
    for j in range(total):
        delay = t0 + j / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if failed:
            break
        task = asyncio.create_task(one(first + j))
        pending.add(task)
        task.add_done_callback(done)
    await asyncio.gather(*pending, return_exceptions=True)
    if failed:
        raise failed[0]
    return {"sent": [list(sent[k : k + 3]) for k in range(0, len(sent), 3)]}


async def _work(runner: Runner, handler_seconds: float) -> dict[str, Any]:
    # A flat array, 16 bytes a job: the worker's memory in a soak is the SDK's, not this list's.
    starts = array("d")

    async def handle(payload: Any) -> None:
        now = time.time()
        seq = payload.get("i", -1) if isinstance(payload, dict) else -1
        starts.extend((seq, now))
        if handler_seconds:
            await asyncio.sleep(handler_seconds)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await runner.work(handle, stop)
    return {"starts": [list(starts[k : k + 2]) for k in range(0, len(starts), 2)]}


def parse_args(
    description: str, add_system_args: Callable[[argparse.ArgumentParser], None]
) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    add_system_args(parser)
    parser.add_argument("mode", choices=("setup", "enqueue", "offer", "work"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--handler-ms", type=float, default=0.0)
    return parser.parse_args()


async def run_mode(args: argparse.Namespace, make: Callable[[], Awaitable[Runner]]) -> None:
    runner = await make()
    # The mode's own CPU: starting the interpreter and importing the system's libraries
    # (about 0.24 s for Evora's runner, 12 us per job of a 20,000-job enqueue) is not work
    # per job.
    started = os.times()
    try:
        if args.mode == "setup":
            await runner.setup()
            result: dict[str, Any] = {}
        elif args.mode == "enqueue":
            result = await _enqueue(runner, args.count, args.batch)
        elif args.mode == "offer":
            result = await _offer(runner, args.rate, args.seconds, args.first)
        else:
            result = await _work(runner, args.handler_ms / 1000)
    finally:
        await runner.close()
    times = os.times()
    result["cpu_seconds"] = times.user + times.system - started.user - started.system
    result["maxrss_kib"] = peak_rss_kib()
    write_json(args.out, result)
