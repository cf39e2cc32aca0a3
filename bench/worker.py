"""CPU per job of the SDK worker alone (`evora.Worker`), against a canned dispatcher.

Not a test: it measures and prints. A stand-in dispatcher runs in a child process (so its
CPU is not the worker's): it answers every claim with a batch of `max_jobs` jobs carrying
every field a real claim has, and every outcome (`acks` in a claim or `POST /v1/acks`) with
200. The worker runs here with the settings of the comparative benchmark (concurrency 100,
one no-op `async def` handler, the SDK's defaults otherwise) until it has run `--jobs`
jobs; the figures are this process's CPU time (`time.process_time`) per job and the young
garbage collections per 1,000 jobs (`gc.get_stats`). It repeats that `--runs` times, each
in a fresh worker. To compare two checkouts, run it with each one's `shared` on PYTHONPATH.

    python -m bench.worker                   # 5 runs of 60,000 jobs
    python -m bench.worker --jobs 20000 --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import socket
import statistics
import time
import uuid
from typing import Any

import orjson

CONCURRENCY = 100
QUEUE = "bench"
JOB_TYPE = "bench.noop"


def _claimed_job(i: int) -> dict[str, Any]:
    """One job as `POST /v1/claim` hands it out (the fields of `ClaimedJob`)."""
    return {
        "id": str(uuid.uuid4()),
        "queue": QUEUE,
        "type": JOB_TYPE,
        "payload": {"i": i},
        "state": "RUNNING",
        "priority": 0,
        "attempt": 1,
        "max_attempts": 3,
        "lease_seconds": 30,
        "timeout_seconds": None,
        "backoff": None,
        "group_key": None,
        "idempotency_key": None,
        "run_at": "2026-11-24T12:00:00.000000Z",
        "created_at": "2026-11-24T12:00:00.000000Z",
        "updated_at": "2026-11-24T12:00:00.000000Z",
        "cancel_requested": False,
        "lease_token": str(uuid.uuid4()),
    }


def _serve_dispatcher(port: int) -> None:
    """The stand-in dispatcher (child process)."""
    from aiohttp import web

    async def claim(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        answer: dict[str, Any] = {"jobs": [_claimed_job(i) for i in range(int(body["max_jobs"]))]}
        if body.get("acks"):
            answer["results"] = [{"id": ack["id"], "status": 200} for ack in body["acks"]]
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    async def acks(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        results = [{"id": ack["id"], "status": 200} for ack in body["acks"]]
        return web.Response(
            body=orjson.dumps({"results": results}), content_type="application/json"
        )

    app = web.Application()
    app.router.add_post("/v1/claim", claim)
    app.router.add_post("/v1/acks", acks)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _run_once(url: str, jobs: int) -> tuple[float, float]:
    """(CPU us per job, young collections per 1,000 jobs) of one worker running `jobs`."""
    from evora.sdk.handlers import Handlers, Job
    from evora.sdk.worker import Worker

    done = asyncio.Event()
    count = 0

    handlers = Handlers()

    @handlers.job(JOB_TYPE)
    async def noop(job: Job) -> None:
        nonlocal count
        count += 1
        if count == jobs:
            done.set()

    worker = Worker(url, "token", [QUEUE], CONCURRENCY, handlers=handlers)
    serving = asyncio.create_task(worker.serve())
    gc.collect()
    young_before = gc.get_stats()[0]["collections"]
    cpu_before = time.process_time()
    await done.wait()
    cpu = time.process_time() - cpu_before
    young = gc.get_stats()[0]["collections"] - young_before
    await worker.stop()
    await serving
    return cpu / jobs * 1e6, young / jobs * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=60_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    port = _free_port()
    dispatcher = multiprocessing.get_context("spawn").Process(
        target=_serve_dispatcher, args=(port,), daemon=True
    )
    dispatcher.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            break
        except OSError:
            time.sleep(0.05)
    try:
        from evora import loops

        per_job: list[float] = []
        for run in range(1, args.runs + 1):
            cpu_us, young = loops.run(_run_once(url, args.jobs))
            per_job.append(cpu_us)
            print(
                f"run {run}: {cpu_us:.1f} us CPU per job, "
                f"{young:.1f} young collections per 1,000 jobs",
                flush=True,
            )
        print(
            f"median {statistics.median(per_job):.1f} us per job, "
            f"best {min(per_job):.1f} ({args.runs} runs of {args.jobs} jobs)"
        )
    finally:
        dispatcher.terminate()
        dispatcher.join()


if __name__ == "__main__":
    main()
