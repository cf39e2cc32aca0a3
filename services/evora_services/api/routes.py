"""The producer and admin endpoints (docs/http-api.md).

Each endpoint is declared once with `Routes.add`: that declaration routes it, tells the
auth middleware who may call it and writes its part of /openapi.json. Errors are raised
(EvoraError subclasses from the store, Problems from parsing) and rendered as problem+json
by the base app's middleware.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar
from uuid import UUID

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ValidationError

from evora.coalesce import Coalescer
from evora.config import Role, Settings
from evora.domain.errors import EvoraError, QueueFull
from evora.http.app import SETTINGS
from evora.http.bodies import (
    ItemsLimit,
    items_limit,
    keep_exact_values,
    parse_body,
    parse_query,
    read_json_body,
    validate_body,
)
from evora.http.jsonio import json_response
from evora.http.routing import Routes
from evora.protocol.fields import CHECKED_TOGETHER, QueueName, all_fit
from evora.protocol.jobs import (
    BatchResult,
    BatchSubmission,
    Events,
    JobList,
    JobResponse,
    JobSubmission,
    QueuePauseState,
    Redriven,
    RedriveRequest,
)
from evora.storage.jobs import JobStore
from evora.storage.rows import JobDict
from evora.storage.submissions import Submitted
from evora_services.api.models import (
    JobListQuery,
    PageQuery,
    encode_cursor,
)
from evora_services.api.paths import job_id, queue_name
from evora_services.api.reads import read_jobs
from evora_services.api.tracing import TracedSubmission, submit_trace

STORE = web.AppKey("store", JobStore)
# Concurrent single submissions share one statement and one commit (see evora.coalesce),
# each with the traceparent its job is stored with.
SUBMITS = web.AppKey("submits", Coalescer[TracedSubmission, Submitted | EvoraError])
# evora_admission_refused_total{queue}: requests refused with queue_full (one per request,
# however many jobs a refused batch held), by the queue of a refused job holding the full
# key: the key itself is unbounded and never a label.
ADMISSION_REFUSED = web.AppKey("admission_refused", Counter)


def admission_refused(registry: CollectorRegistry) -> Counter:
    return Counter(
        "evora_admission_refused",
        "Submission requests refused with 429 queue_full (a key over its max_pending), by "
        "the queue of the refused job holding that key.",
        ["queue"],
        registry=registry,
    )


def _counted(request: web.Request, refused: QueueFull) -> QueueFull:
    request.app[ADMISSION_REFUSED].labels(refused.queue).inc()
    return refused


PRODUCER: tuple[Role, ...] = ("producer",)
ADMIN: tuple[Role, ...] = ("admin",)

KIB = 1024
# Room for every submission field besides the payload, and for JSON escapes and whitespace
# that the payload's compact encoding (what EVORA_MAX_PAYLOAD_BYTES measures) does not have.
SUBMISSION_OVERHEAD = 64 * KIB
# Bodies that hold only a few small fields.
SMALL_BODY_LIMIT = 64 * KIB

REPLAYED_HEADER = "Idempotent-Replayed"

Body = TypeVar("Body", bound=BaseModel)

# Every endpoint here uses the database: 503 when it is unavailable.
producer = Routes("producer", path={"id": UUID}, problems=(503,))
admin = Routes("admin", path={"id": UUID, "queue": QueueName}, problems=(503,))


def submission_body_limit(settings: Settings) -> int:
    return settings.max_payload_bytes + SUBMISSION_OVERHEAD


def batch_body_limit(settings: Settings) -> ItemsLimit:
    return items_limit(settings.max_payload_bytes)


def _store(request: web.Request) -> JobStore:
    return request.app[STORE]


async def _submissions(
    request: web.Request, model: type[Body], limit: Callable[[Settings], int | ItemsLimit]
) -> Body:
    """A submission or batch body: payloads are checked against EVORA_MAX_PAYLOAD_BYTES."""
    settings = request.app[SETTINGS]
    return await parse_body(
        request,
        model,
        limit=limit(settings),
        context={"max_payload_bytes": settings.max_payload_bytes},
    )


# -- producer ------------------------------------------------------------------------------


@producer.add(
    "POST",
    "/v1/jobs",
    roles=PRODUCER,
    summary=(
        "Submit one job. 201 when created; 200 and header `Idempotent-Replayed: true` when "
        "its idempotency key was already used in the queue with the same fields; 200 and "
        '`"debounced": true` or `"throttled": true` when a debounce or throttle key answered '
        "it with its job (docs/flow-control.md, Debounce and throttle); 429 "
        "`queue_full` (with `Retry-After`) when a key it holds is at its max_pending."
    ),
    body=JobSubmission,
    responses={201: JobResponse, 200: JobResponse},
    problems=(409, 429),
)
async def submit(request: web.Request) -> web.Response:
    submission = await _submissions(request, JobSubmission, submission_body_limit)
    with submit_trace(request, [submission]) as trace:
        try:
            submitted = await request.app[SUBMITS].submit((submission, trace.traceparent))
        except QueueFull as refused:
            raise _counted(request, refused) from None
        if isinstance(submitted, EvoraError):
            raise submitted
        trace.record([submitted])
    if submitted.created:
        return json_response(submitted.job, status=201)
    if submitted.answered_by_key is not None:
        return json_response(_answered(submitted))
    return json_response(submitted.job, headers={REPLAYED_HEADER: "true"})


def _answered(submitted: Submitted) -> JobDict:
    """The job a debounce or throttle key answered with, saying so."""
    if submitted.answered_by_key is None:
        return submitted.job
    return {**submitted.job, submitted.answered_by_key: True}


@producer.add(
    "POST",
    "/v1/jobs/batch",
    roles=PRODUCER,
    summary=(
        "Submit 1..1000 jobs in one transaction. Any invalid item fails the whole batch "
        "(the error names its index) and nothing is stored; so does a key the new jobs would "
        "take over its max_pending (429 `queue_full`, with `Retry-After`)."
    ),
    body=BatchSubmission,
    responses={200: BatchResult},
    problems=(409, 429),
)
async def submit_batch(request: web.Request) -> web.Response:
    batch = await _batch(request)
    minimal = _prefers_minimal(request)
    with submit_trace(request, batch.jobs) as trace:
        try:
            submitted = await _store(request).submit_batch(
                batch.jobs, [trace.traceparent] * len(batch.jobs), with_jobs=not minimal
            )
        except QueueFull as refused:
            raise _counted(request, refused) from None
        trace.record(submitted)
    if minimal:
        # Ids and statuses only: a producer that keeps no job spares the decoding and
        # encoding of a thousand whole jobs here and their parsing on its side.
        return json_response(
            {
                "jobs": [
                    {"id": s.id, "status": 201 if s.created else 200}
                    | ({} if s.answered_by_key is None else {s.answered_by_key: True})
                    for s in submitted
                ]
            },
            headers={"Preference-Applied": "return=minimal"},
        )
    return json_response(
        {"jobs": [{"status": 201 if s.created else 200, "job": _answered(s)} for s in submitted]}
    )


async def _batch(request: web.Request) -> BatchSubmission:
    """A batch body, its payloads checked against EVORA_MAX_PAYLOAD_BYTES all at once (one
    encoding for the batch, not one per item). When that check or any other fails, the
    body is validated again payload by payload, which says exactly which item breaks what."""
    settings = request.app[SETTINGS]
    raw = await read_json_body(request, batch_body_limit(settings))
    context = {"max_payload_bytes": settings.max_payload_bytes}
    try:
        batch = BatchSubmission.model_validate_json(
            raw, context={**context, CHECKED_TOGETHER: True}
        )
    except ValidationError:
        return validate_body(raw, BatchSubmission, context)
    if all_fit([job.payload for job in batch.jobs], settings.max_payload_bytes):
        return keep_exact_values(raw, batch)
    del batch  # not held while the body is parsed again
    return validate_body(raw, BatchSubmission, context)


def _prefers_minimal(request: web.Request) -> bool:
    """Whether a `Prefer` header (RFC 7240: comma-separated preferences, each possibly with
    `;` parameters, the value possibly quoted) asks for `return=minimal`."""
    for header in request.headers.getall("Prefer", ()):
        for preference in header.split(","):
            name, _, value = preference.split(";", 1)[0].partition("=")
            if name.strip().lower() == "return" and value.strip().strip('"') == "minimal":
                return True
    return False


@producer.add(
    "GET",
    "/v1/jobs/{id}",
    roles=PRODUCER,
    summary="The job.",
    responses={200: JobResponse},
    problems=(404,),
)
async def get_job(request: web.Request) -> web.Response:
    wanted = job_id(request)
    job, headers = await read_jobs(request, lambda store: store.get(wanted))
    return json_response(job, headers=headers)


@producer.add(
    "GET",
    "/v1/jobs/{id}/events",
    roles=PRODUCER,
    summary="The job's events, oldest first.",
    responses={200: Events},
    problems=(404,),
)
async def job_events(request: web.Request) -> web.Response:
    wanted = job_id(request)
    events, headers = await read_jobs(request, lambda store: store.events(wanted))
    return json_response({"events": events}, headers=headers)


@producer.add(
    "GET",
    "/v1/jobs/{id}/dependents",
    roles=PRODUCER,
    summary="The jobs that depend on this one, in submission order, a page at a time.",
    query=PageQuery,
    responses={200: JobList},
    problems=(404,),
)
async def job_dependents(request: web.Request) -> web.Response:
    query = parse_query(request, PageQuery)
    wanted = job_id(request)
    page, headers = await read_jobs(
        request, lambda store: store.dependents(wanted, limit=query.limit, after=query.after)
    )
    cursor = None if page.next_after is None else encode_cursor(page.next_after)
    return json_response({"jobs": page.jobs, "next": cursor}, headers=headers)


@producer.add(
    "POST",
    "/v1/jobs/{id}/cancel",
    roles=PRODUCER,
    summary=(
        "Cancel a job. PENDING or WAITING: cancelled now, 200 (the jobs waiting on it follow "
        "their on_dependency_failure). RUNNING: `cancel_requested` is set and "
        "the worker stops it, 202. DLQ (an admin retries or discards it), COMPLETED or "
        "CANCELLED: 409 invalid_state."
    ),
    responses={200: JobResponse, 202: JobResponse},
    problems=(404, 409),
)
async def cancel(request: web.Request) -> web.Response:
    cancelled = await _store(request).cancel(job_id(request))
    return json_response(cancelled.job, status=200 if cancelled.immediate else 202)


# -- admin ---------------------------------------------------------------------------------


@admin.add(
    "GET",
    "/v1/jobs",
    roles=ADMIN,
    summary="Jobs, newest first, a page at a time (pass `next` as `after`).",
    query=JobListQuery,
    responses={200: JobList},
)
async def list_jobs(request: web.Request) -> web.Response:
    query = parse_query(request, JobListQuery)
    page, headers = await read_jobs(
        request,
        lambda store: store.list_jobs(
            queue=query.queue,
            state=query.state,
            type=query.type,
            limit=query.limit,
            after=query.after,
        ),
    )
    cursor = None if page.next_after is None else encode_cursor(page.next_after)
    return json_response({"jobs": page.jobs, "next": cursor}, headers=headers)


@admin.add(
    "POST",
    "/v1/jobs/{id}/retry",
    roles=ADMIN,
    summary="Move a DLQ job back to PENDING with a fresh attempt budget.",
    responses={200: JobResponse},
    problems=(404, 409),
)
async def retry(request: web.Request) -> web.Response:
    return json_response(await _store(request).retry(job_id(request)))


@admin.add(
    "POST",
    "/v1/jobs/{id}/discard",
    roles=ADMIN,
    summary="Move a DLQ job to CANCELLED.",
    responses={200: JobResponse},
    problems=(404, 409),
)
async def discard(request: web.Request) -> web.Response:
    return json_response(await _store(request).discard(job_id(request)))


@admin.add(
    "POST",
    "/v1/queues/{queue}/redrive",
    roles=ADMIN,
    summary=(
        "Move the queue's DLQ jobs back to PENDING, optionally only of one type and at most "
        "`limit` of them. The body may be empty."
    ),
    body=RedriveRequest,
    responses={200: Redriven},
)
async def redrive(request: web.Request) -> web.Response:
    queue = queue_name(request)
    body = await parse_body(request, RedriveRequest, limit=SMALL_BODY_LIMIT)
    moved = await _store(request).redrive(queue, type=body.type, limit=body.limit)
    return json_response({"redriven": moved})


@admin.add(
    "POST",
    "/v1/queues/{queue}/pause",
    roles=ADMIN,
    summary="Stop handing out the queue's jobs; submissions are still accepted.",
    responses={200: QueuePauseState},
    problems=(422,),
)
async def pause(request: web.Request) -> web.Response:
    queue = queue_name(request)
    await _store(request).pause(queue)
    return json_response({"queue": queue, "paused": True})


@admin.add(
    "POST",
    "/v1/queues/{queue}/resume",
    roles=ADMIN,
    summary="Hand out the queue's jobs again.",
    responses={200: QueuePauseState},
    problems=(422,),
)
async def resume(request: web.Request) -> web.Response:
    queue = queue_name(request)
    await _store(request).resume(queue)
    return json_response({"queue": queue, "paused": False})
