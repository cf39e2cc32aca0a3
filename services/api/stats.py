"""Read-model endpoints (CONTRACT section 4): queue stats and workers, served from MongoDB
(eventually consistent), with `paused` from PostgreSQL."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from evora.config import Role
from evora.domain.errors import QueueNotFound
from evora.domain.models import QueueName
from evora.http.jsonio import json_response
from evora.http.problems import Problem
from evora.http.routing import Routes
from evora.readmodels.reader import ReadModels
from services.api.paths import queue_name
from services.api.routes import STORE

READ_MODELS = web.AppKey("read_models", ReadModels)

ADMIN: tuple[Role, ...] = ("admin",)

# Read models in MongoDB, `paused` from PostgreSQL: 503 when either is unavailable.
stats = Routes("stats", path={"queue": QueueName}, problems=(503,))


class Percentiles(BaseModel):
    p50: float
    p95: float
    p99: float


class Latency(BaseModel):
    wait: Percentiles
    run: Percentiles


class Throughput(BaseModel):
    completed_per_minute: dict[str, float]


class AsOf(BaseModel):
    seq: int
    at: datetime | None


class QueueStats(BaseModel):
    queue: str
    paused: bool
    counts: dict[str, int]
    totals: dict[str, int]
    throughput: Throughput
    latency_ms: Latency
    oldest_pending_at: datetime | None
    as_of: AsOf


class QueueList(BaseModel):
    queues: list[QueueStats]


class WorkerActivity(BaseModel):
    worker_id: str
    first_seen: datetime | None
    last_seen: datetime | None
    queues: list[str]
    running: int
    current_jobs: list[str]
    claimed: int
    completed: int
    failed: int
    released: int
    lease_expired: int


class WorkerList(BaseModel):
    workers: list[WorkerActivity]


class FailureReason(BaseModel):
    type: str | None
    message: str
    count: int
    last_at: datetime


class TypeFailures(BaseModel):
    type: str
    failures: int
    reasons: list[FailureReason]


class FailureList(BaseModel):
    queue: str
    types: list[TypeFailures]


def _read_models(request: web.Request) -> ReadModels:
    if READ_MODELS not in request.app:
        raise Problem(
            503,
            "read_models_unavailable",
            "Read models unavailable",
            "EVORA_MONGO_URL is not configured for this api",
        )
    return request.app[READ_MODELS]


async def _paused(request: web.Request) -> set[str]:
    return set(await request.app[STORE].all_paused())


@stats.add(
    "GET",
    "/v1/queues",
    roles=ADMIN,
    summary="Stats of every queue seen, from the read models.",
    responses={200: QueueList},
)
async def list_queues(request: web.Request) -> web.Response:
    queues = await _read_models(request).all_queue_stats(await _paused(request))
    return json_response({"queues": queues})


@stats.add(
    "GET",
    "/v1/queues/{queue}/stats",
    roles=ADMIN,
    summary="Read-model stats of one queue (eventually consistent; see as_of).",
    responses={200: QueueStats},
    problems=(404, 422),
)
async def queue_stats(request: web.Request) -> web.Response:
    queue = queue_name(request)
    found = await _read_models(request).queue_stats(queue, await _paused(request))
    if found is None:
        raise QueueNotFound(f"queue {queue!r} has not been seen")
    return json_response(found)


@stats.add(
    "GET",
    "/v1/queues/{queue}/failures",
    roles=ADMIN,
    summary="The most frequent failure reasons per job type of a queue.",
    responses={200: FailureList},
    problems=(422,),
)
async def queue_failures(request: web.Request) -> web.Response:
    queue = queue_name(request)
    types: list[dict[str, Any]] = await _read_models(request).failures(queue)
    return json_response({"queue": queue, "types": types})


@stats.add(
    "GET",
    "/v1/workers",
    roles=ADMIN,
    summary="Workers seen in the last 24 hours, most recent first, from the read models.",
    responses={200: WorkerList},
)
async def workers(request: web.Request) -> web.Response:
    return json_response({"workers": await _read_models(request).workers()})
