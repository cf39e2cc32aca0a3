"""An in-memory stand-in for the api and dispatcher services, over real HTTP.

It implements the parts of docs/http-api.md that the SDK tests exercise, with
the same semantics (states, lease tokens, long-poll, problem+json), so that the SDK is
tested against an HTTP peer before the real services exist. It is not a model of the
database: no durability, no transactions, retries are delayed by an hour instead of backoff.

Tests can inject faults (`fault()`), watch every request (`requests`), and await conditions
(`wait_until`) instead of sleeping.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

ADMIN_TOKEN = "admin-token"
PRODUCER_TOKEN = "producer-token"
WORKER_TOKEN = "worker-token"
TOKENS = {ADMIN_TOKEN: "admin", PRODUCER_TOKEN: "producer", WORKER_TOKEN: "worker"}
FINAL = {"COMPLETED", "CANCELLED"}
SUBMISSION_FIELDS = (
    "payload",
    "priority",
    "run_at",
    "delay_seconds",
    "max_attempts",
    "lease_seconds",
    "backoff",
    "expires_at",
    "group_key",
)


def now() -> str:
    return datetime.now(UTC).isoformat()


class Problem(Exception):
    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.extra = status, code, detail, extra

    def response(self) -> web.Response:
        body = {
            "type": f"https://evora.dev/problems/{self.code}",
            "title": self.code.replace("_", " ").capitalize(),
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
            **self.extra,
        }
        return web.Response(
            status=self.status, body=orjson.dumps(body), content_type="application/problem+json"
        )


def respond(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(data), content_type="application/json", headers=headers
    )


@dataclass
class Fault:
    """Answer the next matching request with `status`; with `after`, only once the request
    has been handled for real (an answer lost on the way back)."""

    method: str
    route: str
    status: int
    after: bool = False
    delay: float = 0.0


@dataclass
class Seen:
    method: str
    route: str
    path: str
    body: Any


@dataclass
class FakeEvora:
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Seen] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    active_claims: int = 0
    paused: set[str] = field(default_factory=set)
    _leases: dict[str, str] = field(default_factory=dict)
    _finished_by: dict[str, str] = field(default_factory=dict)
    _not_before: dict[str, float] = field(default_factory=dict)
    _keys: dict[tuple[str, str], tuple[str, bytes]] = field(default_factory=dict)
    _events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _watchers: set[asyncio.Event] = field(default_factory=set)
    _runner: web.AppRunner | None = None
    port: int = 0

    # Running the server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Listen on 127.0.0.1, on the same port as before after a `stop()`."""
        runner = web.AppRunner(self._app(), handler_cancellation=True, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.port)
        await site.start()
        self.port = runner.addresses[0][1]
        self._runner = runner

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def fault(
        self, method: str, route: str, status: int = 503, *, after: bool = False, delay: float = 0
    ) -> None:
        self.faults.append(Fault(method, route, status, after, delay))

    def seen(self, method: str, route: str) -> list[Seen]:
        return [r for r in self.requests if r.method == method and r.route == route]

    async def wait_until(self, condition: Callable[[], bool], within: float = 5.0) -> None:
        """Wait until `condition()` holds; it is checked after every request handled."""
        async with asyncio.timeout(within):
            while not condition():
                watcher = asyncio.Event()
                self._watchers.add(watcher)
                try:
                    await watcher.wait()
                finally:
                    self._watchers.discard(watcher)

    def touch(self) -> None:
        for watcher in self._watchers:
            watcher.set()

    def state(self, job_id: str) -> str:
        return str(self.jobs[job_id]["state"])

    def take_lease_away(self, job_id: str) -> None:
        """What the sweeper does when a lease expires: back to PENDING, token void."""
        self._move(job_id, "PENDING", "lease_expired")
        self._leases.pop(job_id, None)
        self._not_before[job_id] = asyncio.get_running_loop().time() + 3600
        self.touch()

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        routes: list[tuple[str, str, Callable[[web.Request], Awaitable[web.Response]]]] = [
            ("POST", "/v1/jobs", self._submit),
            ("POST", "/v1/jobs/batch", self._submit_batch),
            ("GET", "/v1/jobs", self._list),
            ("GET", "/v1/jobs/{id}", self._get),
            ("GET", "/v1/jobs/{id}/events", self._get_events),
            ("POST", "/v1/jobs/{id}/cancel", self._cancel),
            ("POST", "/v1/jobs/{id}/retry", self._retry),
            ("GET", "/v1/queues/{queue}/stats", self._stats),
            ("POST", "/v1/claim", self._claim),
            ("POST", "/v1/jobs/{id}/heartbeat", self._heartbeat),
            ("POST", "/v1/jobs/{id}/complete", self._complete_endpoint),
            ("POST", "/v1/jobs/{id}/fail", self._fail_endpoint),
            ("POST", "/v1/jobs/{id}/release", self._release),
            ("POST", "/v1/acks", self._acks),
        ]
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)
        return app

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        route = request.match_info.route.resource
        canonical = route.canonical if route is not None else request.path
        raw = await request.read()
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            return Problem(400, "malformed_json", "not JSON").response()
        self.requests.append(Seen(request.method, canonical, request.path, body))
        fault = next(
            (f for f in self.faults if (f.method, f.route) == (request.method, canonical)), None
        )
        try:
            if fault is not None:
                self.faults.remove(fault)
                await asyncio.sleep(fault.delay)
                if not fault.after:
                    return Problem(fault.status, f"http_{fault.status}", "injected").response()
            self._authorize(request, canonical)
            response = await handler(request)
            if fault is not None:
                return Problem(fault.status, f"http_{fault.status}", "injected").response()
            return response
        except Problem as problem:
            return problem.response()
        finally:
            self.touch()

    def _authorize(self, request: web.Request, route: str) -> None:
        header = request.headers.get("Authorization", "")
        role = TOKENS.get(header.removeprefix("Bearer "))
        if role is None:
            raise Problem(401, "unauthorized", "unknown token")
        worker_routes = {"/v1/claim", "/v1/acks"} | {
            f"/v1/jobs/{{id}}/{action}" for action in ("heartbeat", "complete", "fail", "release")
        }
        producer_routes = {
            "/v1/jobs",
            "/v1/jobs/batch",
            "/v1/jobs/{id}",
            "/v1/jobs/{id}/events",
            "/v1/jobs/{id}/cancel",
        }
        if route in worker_routes:
            needed = "worker"
        elif route in producer_routes and not (route == "/v1/jobs" and request.method == "GET"):
            needed = "producer"
        else:
            needed = "admin"
        if role not in (needed, "admin"):
            raise Problem(403, "forbidden", f"the {role} role may not call this")

    # Producer and admin API

    def _job(self, request: web.Request) -> dict[str, Any]:
        job = self.jobs.get(request.match_info["id"])
        if job is None:
            raise Problem(404, "job_not_found", "no job with that id")
        return job

    def _move(self, job_id: str, to: str, event: str, **data: Any) -> None:
        job = self.jobs[job_id]
        self._events[job_id].append(
            {"job_id": job_id, "event": event, "from_state": job["state"], "to_state": to, **data}
        )
        job["state"] = to
        job["updated_at"] = now()
        if to in FINAL or to == "DLQ":
            job["finished_at"] = now()

    def _create(self, body: Any) -> tuple[int, dict[str, Any]]:
        errors = [
            {"loc": ["body", name], "msg": "Field required"}
            for name in ("queue", "type")
            if not isinstance(body, dict) or not isinstance(body.get(name), str)
        ]
        if errors:
            raise Problem(422, "validation_error", "invalid submission", errors=errors)
        key = body.get("idempotency_key")
        fingerprint = orjson.dumps(
            {name: body.get(name) for name in ("type", *SUBMISSION_FIELDS)},
            option=orjson.OPT_SORT_KEYS,
        )
        if key is not None and (body["queue"], key) in self._keys:
            job_id, existing = self._keys[(body["queue"], key)]
            if existing != fingerprint:
                raise Problem(409, "idempotency_conflict", "key used with other fields")
            return 200, self.jobs[job_id]
        stamp = now()
        job: dict[str, Any] = {
            "id": str(uuid.uuid4()),
            "queue": body["queue"],
            "type": body["type"],
            "payload": body.get("payload", {}),
            "state": "PENDING",
            "priority": body.get("priority", 0),
            "group_key": body.get("group_key"),
            "idempotency_key": key,
            "attempt": 0,
            "max_attempts": body.get("max_attempts", 5),
            "lease_seconds": body.get("lease_seconds", 30),
            "run_at": stamp,
            "expires_at": None,
            "lease_expires_at": None,
            "worker_id": None,
            "cancel_requested": False,
            "result": None,
            "last_error": None,
            "created_at": stamp,
            "updated_at": stamp,
            "started_at": None,
            "finished_at": None,
        }
        self.jobs[job["id"]] = job
        self._events[job["id"]] = [{"job_id": job["id"], "event": "submitted"}]
        if key is not None:
            self._keys[(body["queue"], key)] = (job["id"], fingerprint)
        return 201, job

    async def _submit(self, request: web.Request) -> web.Response:
        status, job = self._create(await request.json(loads=orjson.loads))
        headers = {"Idempotent-Replayed": "true"} if status == 200 else None
        return respond(job, status, headers)

    async def _submit_batch(self, request: web.Request) -> web.Response:
        body = await request.json(loads=orjson.loads)
        results = [self._create(item) for item in body["jobs"]]
        return respond({"jobs": [{"status": status, "job": job} for status, job in results]})

    async def _get(self, request: web.Request) -> web.Response:
        return respond(self._job(request))

    async def _get_events(self, request: web.Request) -> web.Response:
        return respond({"events": self._events[self._job(request)["id"]]})

    async def _list(self, request: web.Request) -> web.Response:
        newest_first = list(reversed(self.jobs.values()))
        matching = [
            job
            for job in newest_first
            if all(
                request.query.get(name) in (None, job[name]) for name in ("queue", "state", "type")
            )
        ]
        after = request.query.get("after")
        if after is not None:
            ids = [job["id"] for job in matching]
            matching = matching[ids.index(after) + 1 :]
        limit = int(request.query.get("limit", "50"))
        page = matching[:limit]
        more = len(matching) > limit
        return respond({"jobs": page, "next": page[-1]["id"] if more else None})

    async def _cancel(self, request: web.Request) -> web.Response:
        job = self._job(request)
        if job["state"] == "PENDING":
            self._move(job["id"], "CANCELLED", "cancelled")
            return respond(job)
        if job["state"] == "RUNNING":
            job["cancel_requested"] = True
            return respond(job, 202)
        raise Problem(409, "invalid_state", f"the job is {job['state']}")

    async def _retry(self, request: web.Request) -> web.Response:
        job = self._job(request)
        if job["state"] != "DLQ":
            raise Problem(409, "invalid_state", f"the job is {job['state']}")
        self._move(job["id"], "PENDING", "retried")
        job["attempt"] = 0
        self._not_before.pop(job["id"], None)
        return respond(job)

    async def _stats(self, request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        jobs = [job for job in self.jobs.values() if job["queue"] == queue]
        if not jobs:
            raise Problem(404, "queue_not_found", "no such queue")
        counts = {s: 0 for s in ("PENDING", "RUNNING", "COMPLETED", "DLQ", "CANCELLED")}
        for job in jobs:
            counts[job["state"]] += 1
        return respond({"queue": queue, "paused": queue in self.paused, "counts": counts})

    # Worker API

    def _claimable(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        clock = asyncio.get_running_loop().time()
        types = body.get("types")
        return [
            job
            for job in self.jobs.values()
            if job["state"] == "PENDING"
            and job["queue"] in body["queues"]
            and job["queue"] not in self.paused
            and (types is None or job["type"] in types)
            and self._not_before.get(job["id"], 0) <= clock
        ][: body.get("max_jobs", 1)]

    async def _claim(self, request: web.Request) -> web.Response:
        body = await request.json(loads=orjson.loads)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + body.get("wait_seconds", 20)
        self.active_claims += 1
        self.touch()
        try:
            while not (jobs := self._claimable(body)) and loop.time() < deadline:
                watcher = asyncio.Event()
                self._watchers.add(watcher)
                try:
                    await asyncio.wait_for(watcher.wait(), deadline - loop.time())
                except TimeoutError:
                    pass
                finally:
                    self._watchers.discard(watcher)
            claimed = []
            for job in jobs:
                self._move(job["id"], "RUNNING", "claimed")
                job["attempt"] += 1
                job["worker_id"] = body["worker_id"]
                job["started_at"] = now()
                token = str(uuid.uuid4())
                self._leases[job["id"]] = token
                claimed.append({**job, "lease_token": token})
            return respond({"jobs": claimed})
        finally:
            self.active_claims -= 1

    def _check_lease(self, job: dict[str, Any], token: Any) -> None:
        if job["state"] != "RUNNING" or self._leases.get(job["id"]) != token:
            raise Problem(409, "lease_lost", "not the job's current lease")

    async def _heartbeat(self, request: web.Request) -> web.Response:
        job = self._job(request)
        body = await request.json(loads=orjson.loads)
        self._check_lease(job, body["lease_token"])
        return respond({"lease_expires_at": now(), "cancel_requested": job["cancel_requested"]})

    def _complete(self, job: dict[str, Any], token: Any, result: Any) -> None:
        if job["state"] == "COMPLETED" and self._finished_by.get(job["id"]) == token:
            return  # a repeated complete with the same token succeeds again
        self._check_lease(job, token)
        job["result"] = result
        self._finished_by[job["id"]] = token
        self._move(job["id"], "COMPLETED", "completed")

    def _fail(self, job: dict[str, Any], token: Any, error: dict[str, Any]) -> None:
        self._check_lease(job, token)
        del self._leases[job["id"]]
        job["last_error"] = {"message": error["message"], "type": error.get("type")}
        if job["cancel_requested"]:
            self._move(job["id"], "CANCELLED", "cancelled", error=error)
        elif error.get("retryable", True) and job["attempt"] < job["max_attempts"]:
            self._move(job["id"], "PENDING", "failed", error=error)
            self._not_before[job["id"]] = asyncio.get_running_loop().time() + 3600
        else:
            self._move(job["id"], "DLQ", "dead_lettered", error=error)

    async def _complete_endpoint(self, request: web.Request) -> web.Response:
        job = self._job(request)
        body = await request.json(loads=orjson.loads)
        self._complete(job, body["lease_token"], body.get("result"))
        return respond(job)

    async def _fail_endpoint(self, request: web.Request) -> web.Response:
        job = self._job(request)
        body = await request.json(loads=orjson.loads)
        self._fail(job, body["lease_token"], body["error"])
        return respond(job)

    async def _release(self, request: web.Request) -> web.Response:
        job = self._job(request)
        body = await request.json(loads=orjson.loads)
        self._check_lease(job, body["lease_token"])
        del self._leases[job["id"]]
        job["attempt"] -= 1
        if job["cancel_requested"]:
            self._move(job["id"], "CANCELLED", "cancelled")
        else:
            self._move(job["id"], "PENDING", "released")
        return respond(job)

    async def _acks(self, request: web.Request) -> web.Response:
        body = await request.json(loads=orjson.loads)
        results = []
        for ack in body["acks"]:
            job = self.jobs.get(ack["id"])
            status = 200
            try:
                if job is None:
                    raise Problem(404, "job_not_found", "no job with that id")
                if ack["outcome"] == "complete":
                    self._complete(job, ack["lease_token"], ack.get("result"))
                else:
                    self._fail(job, ack["lease_token"], ack["error"])
            except Problem as problem:
                status = problem.status
            results.append({"id": ack["id"], "status": status})
        return respond({"results": results})
