"""The schedule endpoints (docs/http-api.md, docs/schedules.md): cron-style periodic jobs.

The api only stores schedules; the scheduler in the sweeper makes their jobs.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any
from uuid import UUID

from aiohttp import web
from pydantic import ConfigDict, Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from evora.config import Role
from evora.domain.cron import Cron, CronError, zone
from evora.domain.errors import ScheduleNotFound
from evora.domain.misfire import Misfire
from evora.http.app import SETTINGS
from evora.http.bodies import parse_body, parse_query
from evora.http.jsonio import json_response
from evora.http.problems import Problem, validation_problem
from evora.http.routing import Routes
from evora.protocol.bounds import DEPENDENCY_REF_PREFIX, MAX_PAGE, QUEUE_PATTERN
from evora.protocol.fields import LazyModel
from evora.protocol.jobs import JobResponse, JobSubmission, LastError
from evora.storage.schedules import ScheduleSpec, ScheduleStore
from evora_services.api.routes import submission_body_limit
from evora_services.api.stats import QueueCursor, encode_key

SCHEDULES = web.AppKey("schedules", ScheduleStore)

ADMIN: tuple[Role, ...] = ("admin",)
# Schedule names use the alphabet of queue names (so a tick's key stays within 255 characters).
ScheduleName = Annotated[str, Field(pattern=QUEUE_PATTERN)]
_NAME = re.compile(QUEUE_PATTERN)

schedules = Routes("schedules", path={"name": ScheduleName}, problems=(503,))


class ScheduledJob(JobSubmission):
    """The job each tick submits: a submission without `idempotency_key`."""

    idempotency_key: SkipJsonSchema[None] = None

    @field_validator("idempotency_key", mode="before")
    @classmethod
    def _no_key(cls, value: Any) -> None:
        if value is not None:
            raise ValueError("each tick's job gets the key schedule:<name>:<tick>; give none")

    # Each tick's job has its idempotency key, which neither combines with (docs/flow-control.md).
    debounce: SkipJsonSchema[None] = None
    throttle: SkipJsonSchema[None] = None

    @field_validator("debounce", "throttle", mode="before")
    @classmethod
    def _no_debounce(cls, value: Any) -> None:
        if value is not None:
            raise ValueError(
                "a schedule's job has its own idempotency key per tick: no "
                "debounce or throttle (a schedule already spaces its jobs)"
            )

    @field_validator("depends_on")
    @classmethod
    def _no_refs(cls, value: list[UUID | str]) -> list[UUID | str]:
        # A tick submits one job, not a batch, so a "ref:" names nothing: every firing would
        # be refused.
        if any(isinstance(dep, str) for dep in value):
            raise ValueError(
                f'"{DEPENDENCY_REF_PREFIX}<name>" names an item of the same batch; a '
                "schedule's job depends on jobs by id"
            )
        return value


class ScheduleBody(LazyModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    cron: str = Field(
        description="five fields (minute hour day-of-month month day-of-week) or @hourly, "
        "@daily, @weekly, @monthly, @yearly",
        examples=["*/5 * * * *"],
    )
    timezone: str = Field(default="UTC", description="an IANA zone, e.g. Europe/Berlin")
    job: ScheduledJob
    misfire: Misfire = Field(
        default=Misfire.RUN_ONCE, description="what ticks missed during downtime make"
    )
    misfire_grace_seconds: int = Field(
        default=60, ge=1, le=86400, description="a tick handled this late or later is missed"
    )
    paused: bool = False

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        try:
            return Cron.parse(value).expression
        except CronError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            zone(value)
        except CronError as exc:
            raise ValueError(str(exc)) from None
        return value


class Schedule(LazyModel):
    name: str
    cron: str
    timezone: str
    job: dict[str, Any] = Field(description="the submission each tick makes")
    misfire: Misfire
    misfire_grace_seconds: int
    paused: bool
    next_run_at: datetime | None = Field(description="the next tick; null while paused")
    last_run_at: datetime | None = Field(description="when it last made a job (tick or trigger)")
    last_job_id: str | None = Field(description="the job it made last")
    last_error: LastError | None = Field(
        description="why its last failed step made no job (kept after it recovers)"
    )
    last_error_at: datetime | None = Field(description="when that step failed")
    failing_since: datetime | None = Field(
        description="the first failure of the current streak; null once a step succeeds"
    )
    consecutive_failures: int = Field(
        description="steps that failed in a row; a failed step's ticks make no job"
    )
    created_at: datetime
    updated_at: datetime


class ScheduleList(LazyModel):
    schedules: list[Schedule]
    next: str | None = Field(description="pass as `after` for the next page; null at the end")


class ScheduleListQuery(LazyModel):
    # lax (query values are strings); unknown parameters refused, not silently ignored
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=MAX_PAGE)
    after: QueueCursor | None = None


def _store(request: web.Request) -> ScheduleStore:
    return request.app[SCHEDULES]


def _name(request: web.Request) -> str:
    """The `{name}` of the path. A name no schedule could have names none: 404."""
    name = request.match_info["name"]
    if not _NAME.fullmatch(name):
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return name


def _invalid_name() -> Problem:
    return validation_problem(
        [
            {
                "loc": ["path", "name"],
                "msg": f"a schedule name matches {QUEUE_PATTERN}",
                "type": "string_pattern_mismatch",
            }
        ]
    )


def _now() -> datetime:
    return datetime.now(UTC)


@schedules.add(
    "PUT",
    "/v1/schedules/{name}",
    roles=ADMIN,
    summary=(
        "Create or replace a schedule: 201 when new, 200 when replaced. A replaced schedule "
        "never makes a tick's job twice."
    ),
    body=ScheduleBody,
    responses={201: Schedule, 200: Schedule},
)
async def put_schedule(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if not _NAME.fullmatch(name):
        raise _invalid_name()
    settings = request.app[SETTINGS]
    body = await parse_body(
        request,
        ScheduleBody,
        limit=submission_body_limit(settings),
        context={"max_payload_bytes": settings.max_payload_bytes},
    )
    spec = ScheduleSpec(
        cron=body.cron,
        timezone=body.timezone,
        # the payload as it is: it may hold the client's exact numbers (orjson fragments)
        job={
            **body.job.model_dump(mode="json", exclude={"idempotency_key", "payload"}),
            "payload": body.job.payload,
        },
        misfire=body.misfire,
        misfire_grace_seconds=body.misfire_grace_seconds,
        paused=body.paused,
    )
    schedule, created = await _store(request).put(name, spec, _now())
    return json_response(schedule, status=201 if created else 200)


@schedules.add(
    "GET",
    "/v1/schedules",
    roles=ADMIN,
    summary="Schedules by name, a page at a time (pass `next` as `after`).",
    query=ScheduleListQuery,
    responses={200: ScheduleList},
)
async def list_schedules(request: web.Request) -> web.Response:
    query = parse_query(request, ScheduleListQuery)
    page = await _store(request).page(after=query.after, limit=query.limit)
    cursor = None if page.next_after is None else encode_key([page.next_after])
    return json_response({"schedules": page.schedules, "next": cursor})


@schedules.add(
    "GET",
    "/v1/schedules/{name}",
    roles=ADMIN,
    summary="The schedule, with its next and last run and last job.",
    responses={200: Schedule},
    problems=(404,),
)
async def get_schedule(request: web.Request) -> web.Response:
    return json_response(await _store(request).get(_name(request)))


@schedules.add(
    "DELETE",
    "/v1/schedules/{name}",
    roles=ADMIN,
    summary="Delete the schedule; jobs it already made stay.",
    responses={204: None},
    problems=(404,),
)
async def delete_schedule(request: web.Request) -> web.Response:
    await _store(request).delete(_name(request))
    return web.Response(status=204)


@schedules.add(
    "POST",
    "/v1/schedules/{name}/pause",
    roles=ADMIN,
    summary="Stop making jobs until resumed. Pausing twice is fine.",
    responses={200: Schedule},
    problems=(404,),
)
async def pause_schedule(request: web.Request) -> web.Response:
    return json_response(await _store(request).pause(_name(request)))


@schedules.add(
    "POST",
    "/v1/schedules/{name}/resume",
    roles=ADMIN,
    summary="Make jobs again from the next tick on; ticks while paused make none.",
    responses={200: Schedule},
    problems=(404,),
)
async def resume_schedule(request: web.Request) -> web.Response:
    return json_response(await _store(request).resume(_name(request), _now()))


@schedules.add(
    "POST",
    "/v1/schedules/{name}/trigger",
    roles=ADMIN,
    summary="Make one job now, outside the ticks (also while paused).",
    responses={201: JobResponse},
    problems=(404,),
)
async def trigger_schedule(request: web.Request) -> web.Response:
    return json_response(await _store(request).trigger(_name(request), _now()), status=201)
