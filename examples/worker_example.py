"""A demo worker: `evora worker examples.worker_example --queues demo` (or set
EVORA_WORKER_QUEUES=demo), with EVORA_WORKER_TOKEN holding a worker token.

Then submit jobs of these types to the queue, e.g. with `evora.Client`:

    await client.submit("demo", "demo.sleep", {"seconds": 30})
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import evora

handlers = evora.Handlers()


@handlers.job("demo.echo")
async def echo(job: evora.Job) -> Any:
    """Completes with its payload as the result."""
    return job.payload


@handlers.job("demo.sleep")
async def sleep(job: evora.Job) -> dict[str, float]:
    """Sleeps `payload["seconds"]` (default 1), reporting progress each second; stops early,
    and the job ends CANCELLED, when cancellation is requested."""
    seconds = float(job.payload.get("seconds", 1)) if isinstance(job.payload, dict) else 1.0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        job.progress({"remaining_seconds": round(left, 1)})
        try:
            await asyncio.wait_for(job.cancel_event.wait(), timeout=min(left, 1.0))
        except TimeoutError:
            continue
        job.raise_if_cancel_requested()
    return {"slept": seconds}


@handlers.job("demo.hash")
def hash_payload(job: evora.Job) -> dict[str, str]:
    """Blocking CPU work in a plain `def`: the worker runs it in a thread, so heartbeats and
    other jobs go on meanwhile. Hashes the payload `payload["rounds"]` times (default
    100000), checking for a cancel request now and then."""
    rounds = int(job.payload.get("rounds", 100_000)) if isinstance(job.payload, dict) else 100_000
    digest = repr(job.payload).encode()
    for done in range(rounds):
        if done % 10_000 == 0:
            job.raise_if_cancel_requested()
            job.progress({"rounds_done": done})
        digest = hashlib.sha256(digest).digest()
    return {"sha256": digest.hex()}


class FlakyServiceError(Exception):
    """A failure worth retrying, like a timeout from a downstream service."""


@handlers.job("demo.fail")
async def fail(job: evora.Job) -> None:
    """Fails retryably: the job is retried with backoff until its attempts run out."""
    raise FlakyServiceError(f"attempt {job.attempt} of {job.max_attempts} failed (on purpose)")


@handlers.job("demo.fatal")
async def fatal(job: evora.Job) -> None:
    """Fails for good: the job goes to the DLQ on its first attempt."""
    raise evora.NonRetryable(f"payload {job.payload!r} can never succeed (on purpose)")
