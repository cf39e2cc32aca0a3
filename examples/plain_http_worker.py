"""A worker without the SDK: nothing but an HTTP client (aiohttp) and JSON, written the way
docs/http-api.md ("Writing a worker without an SDK") tells a worker in any language to be
written, so it is also the reference the SDK worker is measured against (`python -m
bench.plain_http`).

    EVORA_WORKER_TOKEN=... python examples/plain_http_worker.py "$EVORA_DISPATCHER_URL" demo

The token is read from the environment, not the command line: there any user of the machine
could read it (`ps`), and a token may begin with `-` (one in 64 of those that
`secrets.token_urlsafe` makes, as `evora dev` does), which an argument parser takes for an
option: the worker would stop at once with a usage error.

The loop, in each of `lanes` (default 2) concurrent copies, each on a kept-alive connection:

1. `POST /v1/claim` for up to `max_jobs` jobs, long-polling `wait_seconds`, carrying in
   `acks` the outcomes of the batch this lane ran last (recorded as the claim begins);
2. run the jobs handed out, all at once, heartbeating every third of their `lease_seconds`
   while any still runs (a 409 there: the lease is lost, drop the job; `cancel_requested`:
   stop it and release it);
3. back to 1 with their outcomes. Two lanes keep one claim on its way while the other
   lane's jobs run, hiding the network's round trip between batches.

A claim that fails (connection error, 5xx, 429) is retried after an exponential backoff with
jitter; the outcomes it carried are sent again by `POST /v1/acks` (repeating an outcome
with the same lease token is answered 200 again). SIGTERM or SIGINT: no new claims, the
long-poll is dropped, running jobs get `grace_seconds`, the rest are released, the last
outcomes are sent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

Handle = Callable[[dict[str, Any]], Coroutine[Any, Any, Any]]
RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})


async def handle(job: dict[str, Any]) -> Any:
    """The work: `job` is the claimed job (`id`, `type`, `payload`, `attempt`, ...); the
    return value is its result, an exception fails it (retried within its attempts)."""
    return None


def said(exc: BaseException) -> str:
    """An error as logged: its type and message. Not its repr, which for an answer's status
    holds the request's headers, the token among them."""
    return f"{type(exc).__name__}: {exc}"


class Refused(Exception):
    """The dispatcher answered a status that repeating the request will not change."""


class PlainWorker:
    def __init__(
        self,
        url: str,
        token: str,
        queues: list[str],
        types: list[str] | None,
        handle: Handle,
        *,
        max_jobs: int = 100,
        lanes: int = 2,
        wait_seconds: float = 20.0,
        grace_seconds: float = 30.0,
        worker_id: str = "plain-http-worker",
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.claim_body: dict[str, Any] = {"worker_id": worker_id, "queues": queues}
        if types:
            self.claim_body["types"] = types
        self.handle = handle
        self.max_jobs = max_jobs
        self.lanes = lanes
        self.wait_seconds = wait_seconds
        self.grace_seconds = grace_seconds
        self.stopping = asyncio.Event()

    async def post(self, http: aiohttp.ClientSession, path: str, body: Any) -> Any:
        """One request: the decoded answer, `Refused` for a 4xx but 408/429, and
        `aiohttp.ClientError` or `TimeoutError` for what may succeed if sent again."""
        async with http.post(self.url + path, data=json.dumps(body)) as response:
            text = await response.text()
            if response.status in RETRYABLE:
                raise aiohttp.ClientResponseError(
                    response.request_info, (), status=response.status, message=text
                )
            if response.status >= 400:
                raise Refused(f"{path}: {response.status} {text}")
            return json.loads(text)

    async def serve(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.wait_seconds + 10)
        async with aiohttp.ClientSession(headers=self.headers, timeout=timeout) as http:
            await asyncio.gather(*(self.lane(http) for _ in range(self.lanes)))

    async def lane(self, http: aiohttp.ClientSession) -> None:
        acks: list[dict[str, Any]] = []
        failures = 0
        while not self.stopping.is_set():
            body = {**self.claim_body, "max_jobs": self.max_jobs, "acks": acks}
            body["wait_seconds"] = self.wait_seconds
            claim = asyncio.create_task(self.post(http, "/v1/claim", body))
            stop = asyncio.create_task(self.stopping.wait())
            await asyncio.wait({claim, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if not claim.done():
                # Stopping: the dispatcher releases what it claims for a client gone away.
                claim.cancel()
                break
            try:
                answer = claim.result()
            except (aiohttp.ClientError, TimeoutError) as exc:
                failures += 1
                delay = min(10.0, 0.1 * 2**failures) * random.uniform(0.5, 1.0)
                print(f"claim failed ({said(exc)}); again in {delay:.1f}s", file=sys.stderr)
                await asyncio.sleep(delay)
                acks = await self.send_acks(http, acks)  # perhaps not recorded: resend
                continue
            failures = 0
            self.note_results(acks, answer.get("results", []))
            acks = await self.run_batch(http, answer["jobs"])
        await self.send_acks(http, acks)

    def note_results(self, acks: list[dict[str, Any]], results: list[dict[str, Any]]) -> None:
        for ack, result in zip(acks, results, strict=True):
            if result["status"] != 200:
                # 409: the lease ran out (or the job was cancelled or claimed again) and the
                # outcome was not recorded; the job runs again or has ended elsewhere.
                print(f"job {ack['id']}: outcome refused ({result['status']})", file=sys.stderr)

    async def send_acks(
        self, http: aiohttp.ClientSession, acks: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """`POST /v1/acks` until answered (5xx and connection errors back off and repeat);
        returns an empty list for the caller's next batch."""
        failures = 0
        while acks:
            try:
                answer = await self.post(http, "/v1/acks", {"acks": acks})
            except (aiohttp.ClientError, TimeoutError) as exc:
                failures += 1
                if failures > 8:
                    print(f"giving up on {len(acks)} outcomes ({said(exc)})", file=sys.stderr)
                    break
                await asyncio.sleep(min(10.0, 0.1 * 2**failures) * random.uniform(0.5, 1.0))
                continue
            self.note_results(acks, answer["results"])
            break
        return []

    async def run_batch(
        self, http: aiohttp.ClientSession, jobs: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Runs the jobs of one claim at once; their outcomes, in `POST /v1/acks` items."""
        if not jobs:
            return []
        tasks = {asyncio.create_task(self.handle(job)): job for job in jobs}
        lost: set[str] = set()  # jobs whose heartbeat was answered 409: not ours any more
        heartbeats = asyncio.create_task(self.heartbeat(http, tasks, lost))
        stop = asyncio.create_task(self.stopping.wait())
        try:
            running: set[asyncio.Future[Any]] = set(tasks)
            while running and not stop.done():
                _, running = await asyncio.wait(
                    running | {stop}, return_when=asyncio.FIRST_COMPLETED
                )
                running.discard(stop)
            if running:  # stopping: the grace period, then what still runs is released
                await asyncio.wait(running, timeout=self.grace_seconds)
        finally:
            stop.cancel()
            heartbeats.cancel()
        acks: list[dict[str, Any]] = []
        for task, job in tasks.items():
            ack = {"id": job["id"], "lease_token": job["lease_token"]}
            if job["id"] in lost:
                task.cancel()
            elif not task.done() or task.cancelled():
                # Still running after the grace, or stopped for a cancel request: hand it
                # back (a requested cancel makes it CANCELLED).
                task.cancel()
                await self.release(http, ack)
            elif (exc := task.exception()) is not None:
                message = "".join(traceback.format_exception_only(exc)).strip()
                error = {"message": message, "type": type(exc).__name__}
                acks.append({**ack, "outcome": "fail", "error": error})
            else:
                acks.append({**ack, "outcome": "complete", "result": task.result()})
        return acks

    async def heartbeat(
        self,
        http: aiohttp.ClientSession,
        tasks: dict[asyncio.Task[Any], dict[str, Any]],
        lost: set[str],
    ) -> None:
        """While jobs of the batch run, extend their leases every third of the shortest."""
        every = min(job["lease_seconds"] for job in tasks.values()) / 3
        while True:
            await asyncio.sleep(every)
            for task, job in tasks.items():
                if task.done():
                    continue
                path = f"/v1/jobs/{job['id']}/heartbeat"
                try:
                    answer = await self.post(http, path, {"lease_token": job["lease_token"]})
                except Refused:  # 409 lease_lost: someone else owns the job now
                    lost.add(job["id"])
                    task.cancel()
                    continue
                except (aiohttp.ClientError, TimeoutError):
                    continue  # next round; the lease has two more thirds
                if answer["cancel_requested"]:
                    task.cancel()

    async def release(self, http: aiohttp.ClientSession, ack: dict[str, Any]) -> None:
        try:
            await self.post(
                http, f"/v1/jobs/{ack['id']}/release", {"lease_token": ack["lease_token"]}
            )
        except (Refused, aiohttp.ClientError, TimeoutError) as exc:
            # Its lease expires and it runs again, as after a crash.
            print(f"job {ack['id']}: not released ({said(exc)})", file=sys.stderr)


def main(argv: list[str] | None = None, work: Handle = handle) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("url", help="the dispatcher, e.g. $EVORA_DISPATCHER_URL")
    parser.add_argument("queue", nargs="+")
    parser.add_argument("--type", action="append", dest="types", help="claim only these")
    parser.add_argument("--max-jobs", type=int, default=100, help="jobs per claim and lane")
    parser.add_argument("--lanes", type=int, default=2)
    parser.add_argument("--wait-seconds", type=float, default=20.0)
    parser.add_argument("--grace-seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    token = os.environ.get("EVORA_WORKER_TOKEN")
    if not token:
        parser.error("set EVORA_WORKER_TOKEN to a worker token")

    async def serve() -> None:
        worker = PlainWorker(
            args.url,
            token,
            args.queue,
            args.types,
            work,
            max_jobs=args.max_jobs,
            lanes=args.lanes,
            wait_seconds=args.wait_seconds,
            grace_seconds=args.grace_seconds,
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stopping.set)
        await worker.serve()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
