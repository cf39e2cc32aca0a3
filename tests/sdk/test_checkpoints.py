"""`await job.checkpoint(name, data)` and `job.checkpoints` under real workers
(docs/jobs-that-wait.md, "Checkpoints"): a step recorded before the attempt crashed, by an
exception or by SIGKILL of the worker's process, is handed to the next attempt, which skips
it instead of repeating it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any
from uuid import UUID

import evora
from evora import Client
from evora.sdk.client import BackoffSpec
from evora.storage.jobs import JobStore
from tests.polling import until
from tests.sdk.fake import FaultProxy
from tests.sdk.test_worker import REPO, in_state, make_worker, serving, stored
from tests.servers import WORKER_TOKEN

AT_ONCE: BackoffSpec = {"initial_seconds": 0.001, "max_seconds": 0.001}


def _pay(charges: list[str], runs: list[dict[str, Any]], *, crash: bool) -> evora.Handlers:
    """A two-step handler: charge (once, checkpointed), then ship; `crash` fails the first
    attempt between the two."""
    handlers = evora.Handlers()

    @handlers.job("pay")
    async def pay(job: evora.Job) -> dict[str, Any]:
        runs.append(dict(job.checkpoints))
        if "charged" not in job.checkpoints:
            charges.append(job.payload["order"])
            await job.checkpoint("charged", {"charge": f"ch_{job.payload['order']}"})
        if crash and job.attempt == 1:
            raise RuntimeError("crashed after charging")
        return {"shipped_with": job.checkpoints["charged"]}

    return handlers


async def test_a_retry_resumes_after_the_last_checkpoint(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    charges: list[str] = []
    runs: list[dict[str, Any]] = []
    worker = make_worker(proxy, handlers=_pay(charges, runs, crash=True))
    job_id = (await client.submit("q", "pay", {"order": "o-1"}, backoff=AT_ONCE)).id
    async with serving(worker):
        await until(in_state(store, job_id, "COMPLETED"))
    assert charges == ["o-1"]  # charged once, though it ran twice
    assert runs == [{}, {"charged": {"charge": "ch_o-1"}}]
    job = await stored(store, job_id)
    assert (job["attempt"], job["result"]) == (2, {"shipped_with": {"charge": "ch_o-1"}})
    assert job["checkpoints"] == {"charged": {"charge": "ch_o-1"}}
    events = [e["event"] for e in await store.events(UUID(job_id))]
    assert events == ["submitted", "claimed", "checkpointed", "failed", "claimed", "completed"]


async def test_a_checkpoint_survives_the_worker_killed(
    proxy: FaultProxy, client: Client, store: JobStore
) -> None:
    # the first worker: a process of its own, killed once it has charged
    code = (
        "import asyncio\n"
        "import evora\n"
        f"worker = evora.Worker({proxy.url!r}, {WORKER_TOKEN!r}, queues=['q'])\n"
        "@worker.handler('pay')\n"
        "async def pay(job):\n"
        "    await job.checkpoint('charged', {'charge': 'ch_o-2'})\n"
        "    await asyncio.Event().wait()\n"
        "asyncio.run(worker.serve())\n"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("EVORA_")}
    job_id = (
        await client.submit("q", "pay", {"order": "o-2"}, lease_seconds=1, backoff=AT_ONCE)
    ).id
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", code, cwd=REPO, env=env)
    try:
        # Bounded by a new Python process importing the SDK first: under load, over 10 s.
        await until(
            lambda: _checkpointed(store, job_id), "the killed worker's checkpoint", within=60
        )
    finally:
        process.send_signal(signal.SIGKILL)
        await process.wait()
    # its lease runs out (no heartbeats any more) and the sweeper puts the job back
    await until(lambda: _expired(store), "the lease expires", within=10)

    charges: list[str] = []
    runs: list[dict[str, Any]] = []
    worker = make_worker(proxy, handlers=_pay(charges, runs, crash=False))
    async with serving(worker):
        await until(in_state(store, job_id, "COMPLETED"))
    assert charges == [] and runs == [{"charged": {"charge": "ch_o-2"}}]
    job = await stored(store, job_id)
    assert (job["attempt"], job["result"]) == (2, {"shipped_with": {"charge": "ch_o-2"}})


async def _checkpointed(store: JobStore, job_id: str) -> bool:
    return bool((await stored(store, job_id))["checkpoints"])


async def _expired(store: JobStore) -> bool:
    return bool(await store.expire_leases())
