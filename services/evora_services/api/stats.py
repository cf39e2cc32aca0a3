"""Read-model endpoints (docs/http-api.md#queues-and-workers): queue stats and workers,
served from MongoDB (eventually consistent), with `paused` from PostgreSQL."""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime
from typing import Annotated, Any

import orjson
from aiohttp import web
from pydantic import BeforeValidator, ConfigDict, Field, WithJsonSchema

from evora.config import Role
from evora.domain.errors import QueueNotFound
from evora.http.bodies import parse_query
from evora.http.jsonio import json_response
from evora.http.problems import Problem
from evora.http.routing import Routes
from evora.protocol.bounds import LIMIT_NAME_PATTERN, MAX_PAGE, QUEUE_PATTERN, TYPE_PATTERN
from evora.protocol.fields import LazyModel, QueueName
from evora.readmodels.analytics import ALL_TYPES
from evora.readmodels.reader import Page, ReadModels
from evora.readmodels.stats import HISTORY_MINUTES
from evora_services.api.paths import queue_name
from evora_services.api.routes import STORE

READ_MODELS = web.AppKey("read_models", ReadModels)

ADMIN: tuple[Role, ...] = ("admin",)

# Read models in MongoDB, `paused` from PostgreSQL: 503 when either is unavailable.
stats = Routes("stats", path={"queue": QueueName}, problems=(503,))


# -- paging: `limit` and the opaque `after` cursor, the key of the previous page's last item --

QUEUES_PAGE_DEFAULT = 50
_NOT_OURS = "not a cursor returned by this API"


def encode_key(key: list[str]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(key)).rstrip(b"=").decode()


def _decode_key(value: str, arity: int) -> list[str]:
    """Only the exact strings `encode_key` makes are accepted, so a cursor is one we issued
    or a 422, never a silent misread."""
    try:
        raw = base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_", validate=True)
        key: object = orjson.loads(raw)
    except (binascii.Error, ValueError):
        raise ValueError(_NOT_OURS) from None
    if not isinstance(key, list) or len(key) != arity:
        raise ValueError(_NOT_OURS)
    strings = [k for k in key if isinstance(k, str)]
    if strings != key or encode_key(strings) != value:
        raise ValueError(_NOT_OURS)
    return strings


def _queue_after(value: object) -> object:
    if not isinstance(value, str):
        return value
    [queue] = _decode_key(value, 1)
    if not re.fullmatch(QUEUE_PATTERN, queue):
        raise ValueError(_NOT_OURS)
    return queue


def _worker_after(value: object) -> object:
    if not isinstance(value, str):
        return value
    seen, worker = _decode_key(value, 2)
    try:
        at = datetime.fromisoformat(seen)
    except ValueError:
        raise ValueError(_NOT_OURS) from None
    if at.tzinfo is None:
        raise ValueError(_NOT_OURS)
    return (at, worker)


def _type_after(value: object) -> object:
    if not isinstance(value, str):
        return value
    [job_type] = _decode_key(value, 1)
    if job_type != ALL_TYPES and not re.fullmatch(TYPE_PATTERN, job_type):
        raise ValueError(_NOT_OURS)
    return job_type


def _limit_after(value: object) -> object:
    if not isinstance(value, str):
        return value
    [key] = _decode_key(value, 1)
    if not re.fullmatch(LIMIT_NAME_PATTERN, key):
        raise ValueError(_NOT_OURS)
    return key


_CURSOR_SCHEMA = {"type": "string", "description": "the `next` value of the previous page"}
QueueCursor = Annotated[str, BeforeValidator(_queue_after), WithJsonSchema(_CURSOR_SCHEMA)]
LimitCursor = Annotated[str, BeforeValidator(_limit_after), WithJsonSchema(_CURSOR_SCHEMA)]
TypeCursor = Annotated[str, BeforeValidator(_type_after), WithJsonSchema(_CURSOR_SCHEMA)]
WorkerCursor = Annotated[
    tuple[datetime, str], BeforeValidator(_worker_after), WithJsonSchema(_CURSOR_SCHEMA)
]


class AnalyticsQuery(LazyModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=QUEUES_PAGE_DEFAULT, ge=1, le=MAX_PAGE)
    after: QueueCursor | None = None


class AnalyticsTypesQuery(LazyModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=QUEUES_PAGE_DEFAULT, ge=1, le=MAX_PAGE)
    after: TypeCursor | None = None


class QueueListQuery(LazyModel):
    # lax (query values are strings); unknown parameters refused, not silently ignored
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=QUEUES_PAGE_DEFAULT, ge=1, le=MAX_PAGE)
    after: QueueCursor | None = None


class WorkerListQuery(LazyModel):
    model_config = ConfigDict(extra="forbid")

    # The default is the most a page holds: the whole list clients got before paging.
    limit: int = Field(default=MAX_PAGE, ge=1, le=MAX_PAGE)
    after: WorkerCursor | None = None


_MINUTES = Field(
    default=HISTORY_MINUTES,
    ge=1,
    le=HISTORY_MINUTES,
    description="how many minutes, up to and including the current one",
)


class HistoryQuery(LazyModel):
    model_config = ConfigDict(extra="forbid")

    minutes: int = _MINUTES


class HistoryListQuery(LazyModel):
    model_config = ConfigDict(extra="forbid")

    minutes: int = _MINUTES
    limit: int = Field(default=QUEUES_PAGE_DEFAULT, ge=1, le=MAX_PAGE)
    after: QueueCursor | None = None


def _page(member: str, page: Page, header: dict[str, Any] | None = None) -> web.Response:
    """A page of a list (`member`), after the `header` fields that describe the whole list."""
    cursor = None if page.next_key is None else encode_key(page.next_key)
    return json_response({**(header or {}), member: page.items, "next": cursor})


_NEXT = Field(description="pass as `after` for the next page; null at the end")


class Percentiles(LazyModel):
    # null while there is no sample to measure
    p50: float | None
    p95: float | None
    p99: float | None


class Latency(LazyModel):
    wait: Percentiles
    run: Percentiles


class Throughput(LazyModel):
    completed_per_minute: dict[str, float]


class AsOf(LazyModel):
    seq: int
    at: datetime | None


class QueueStats(LazyModel):
    queue: str
    paused: bool
    counts: dict[str, int]
    totals: dict[str, int]
    throughput: Throughput
    latency_ms: Latency
    oldest_pending_at: datetime | None
    as_of: AsOf


class QueueHistory(LazyModel):
    queue: str
    step_seconds: int
    start: datetime = Field(description="the first minute's start (UTC)")
    end: datetime = Field(description="the last minute's end")
    submitted: list[int]
    completed: list[int]
    failed: list[int]
    dead_lettered: list[int]
    wait_ms: list[float | None] = Field(description="mean wait per minute; null: no claim")
    run_ms: list[float | None] = Field(description="mean run time; null: no completion")


class HistoryList(LazyModel):
    history: list[QueueHistory]
    next: str | None = _NEXT


class QueueList(LazyModel):
    queues: list[QueueStats]
    next: str | None = _NEXT


class WorkerActivity(LazyModel):
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


class WorkerList(LazyModel):
    workers: list[WorkerActivity]
    next: str | None = _NEXT


class FailureReason(LazyModel):
    type: str | None
    message: str = Field(description="the message with its variable parts as placeholders")
    count: int
    last_at: datetime
    example: str = Field(description="the latest message of this reason, as reported")
    job_id: str | None = Field(description="the job that failed so last")
    traceback: str | None = Field(description="the end of that failure's stack trace")


class TypeFailures(LazyModel):
    type: str
    failures: int
    reasons: list[FailureReason]


class FailureList(LazyModel):
    queue: str
    types: list[TypeFailures]


class RunAsOf(LazyModel):
    run_id: str
    at: datetime = Field(description="when the run started")
    events: int = Field(description="how many events the run counted, archive plus live")
    seq: int = Field(description="the newest event sequence number counted")
    below_xid: int = Field(description="the outbox horizon: transactions below it only")
    archive: dict[str, int] = Field(description="the archive watermark the run read up to")


class PipelineTotals(LazyModel):
    totals: dict[str, int] = Field(description="the stats `totals` keys")
    by_event: dict[str, int] = Field(description="every event name counted")
    events: int
    run_id: str | None


class ProjectorTotals(LazyModel):
    totals: dict[str, int]


class Rates(LazyModel):
    jobs: int
    retried_jobs: int
    retries: int
    dead_lettered_jobs: int
    retry_rate: float
    dlq_rate: float


class LatencySummary(LazyModel):
    samples: int
    p50_ms: float | None
    p90_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    max_ms: float | None


class QueueAnalytics(LazyModel):
    queue: str
    pipeline: PipelineTotals | None = Field(description="null: not in the latest run")
    projector: ProjectorTotals | None = Field(description="null: not seen by the projector")
    agree: bool = Field(description="both sides present with equal totals")
    rates: Rates | None = Field(description="all the queue's job types together")
    latency: dict[str, LatencySummary | None] = Field(description="`wait` and `run`")


class AnalyticsList(LazyModel):
    ran: bool = Field(description="false until `evora pipeline run` has written results")
    as_of: RunAsOf | None = Field(description="the run shown; null when none ran")
    projector_as_of: AsOf
    queues: list[QueueAnalytics]
    next: str | None = _NEXT


class AnalyticsFailureReason(LazyModel):
    rank: int
    error_type: str | None
    message: str = Field(description="its first 200 characters")
    failures: int
    last_at: datetime | None


class TypeAnalytics(LazyModel):
    type: str = Field(description="the job type; `*`: all the queue's types together")
    events: dict[str, int] = Field(description="events by name")
    jobs: dict[str, int] = Field(description="jobs by the state after their latest event")
    rates: Rates | None
    latency: dict[str, LatencySummary | None] = Field(description="`wait` and `run`")
    failure_reasons: list[AnalyticsFailureReason] = Field(description="most frequent first")


class QueueTypesAnalytics(LazyModel):
    queue: str
    ran: bool
    as_of: RunAsOf | None
    types: list[TypeAnalytics]
    next: str | None = _NEXT


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
    query=QueueListQuery,
    summary="Stats of every queue seen, by name, a page at a time (pass `next` as `after`).",
    responses={200: QueueList},
)
async def list_queues(request: web.Request) -> web.Response:
    query = parse_query(request, QueueListQuery)
    read_models = _read_models(request)
    paused = await _paused(request)
    return _page(
        "queues", await read_models.queue_stats_page(paused, limit=query.limit, after=query.after)
    )


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
    query=WorkerListQuery,
    summary="Workers seen in the last 24 hours, most recent first, a page at a time.",
    responses={200: WorkerList},
)
async def workers(request: web.Request) -> web.Response:
    query = parse_query(request, WorkerListQuery)
    page = await _read_models(request).workers_page(limit=query.limit, after=query.after)
    return _page("workers", page)


@stats.add(
    "GET",
    "/v1/stats/queues/{queue}/history",
    roles=ADMIN,
    query=HistoryQuery,
    summary="Per-minute series of one queue (events and mean latencies), the last 24 h at most.",
    responses={200: QueueHistory},
    problems=(404, 422),
)
async def queue_history(request: web.Request) -> web.Response:
    queue = queue_name(request)
    query = parse_query(request, HistoryQuery)
    found = await _read_models(request).queue_history(queue, query.minutes)
    if found is None:
        raise QueueNotFound(f"queue {queue!r} has not been seen")
    return json_response(found)


@stats.add(
    "GET",
    "/v1/stats/history",
    roles=ADMIN,
    query=HistoryListQuery,
    summary="Per-minute series of every queue, by name, a page at a time.",
    responses={200: HistoryList},
    problems=(422,),
)
async def history(request: web.Request) -> web.Response:
    query = parse_query(request, HistoryListQuery)
    page = await _read_models(request).history_page(
        query.minutes, limit=query.limit, after=query.after
    )
    return _page("history", page)


@stats.add(
    "GET",
    "/v1/analytics",
    roles=ADMIN,
    query=AnalyticsQuery,
    summary="The latest `evora pipeline run` per queue beside the projector's totals, by name, "
    "a page at a time.",
    responses={200: AnalyticsList},
    problems=(422,),
)
async def analytics(request: web.Request) -> web.Response:
    query = parse_query(request, AnalyticsQuery)
    header, page = await _read_models(request).analytics_page(limit=query.limit, after=query.after)
    return _page("queues", page, header)


@stats.add(
    "GET",
    "/v1/analytics/queues/{queue}",
    roles=ADMIN,
    query=AnalyticsTypesQuery,
    summary="The latest `evora pipeline run` for each job type of a queue, a page of types "
    "at a time.",
    responses={200: QueueTypesAnalytics},
    problems=(422,),
)
async def queue_analytics(request: web.Request) -> web.Response:
    queue = queue_name(request)
    query = parse_query(request, AnalyticsTypesQuery)
    header, page = await _read_models(request).analytics_types_page(
        queue, limit=query.limit, after=query.after
    )
    return _page("types", page, {"queue": queue, **header})
