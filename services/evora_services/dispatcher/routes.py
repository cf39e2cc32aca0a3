"""Worker API handlers (docs/http-api.md#worker-api)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import orjson
from aiohttp import web

from evora.domain import ids
from evora.http.app import REQUEST_ID, REQUEST_ID_HEADER, SETTINGS
from evora.http.bodies import items_limit, parse_body
from evora.http.jsonio import json_response
from evora.http.routing import Routes
from evora.protocol.jobs import Job
from evora.protocol.tracing import TRACEPARENT
from evora.protocol.worker import (
    Ack,
    AcksRequest,
    AcksResponse,
    CheckpointRequest,
    CheckpointResponse,
    ChildrenRequest,
    ChildrenResponse,
    ClaimRequest,
    ClaimResponse,
    CompleteRequest,
    ErrorBody,
    FailRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    ReleaseRequest,
    RetryAfter,
    SnoozeRequest,
    SuspendRequest,
    SuspendResponse,
)
from evora.storage import checkpoints
from evora.storage.jobs import AckResult, Completion, Failure
from evora.storage.rows import JobDict
from evora_services.dispatcher.ack_bodies import read_acks, read_claim
from evora_services.dispatcher.state import DISPATCH, Dispatch
from evora_services.dispatcher.wakeups import Cause

log = logging.getLogger(__name__)

# Every endpoint here uses the database: 503 when it is unavailable.
routes = Routes("worker", path={"id": UUID}, problems=(503,))

CLAIM_BODY_LIMIT = 64 * 1024
_ENVELOPE = 64 * 1024  # room for the fields around a payload-sized value


# What each item of POST /v1/acks answers (and the status a single complete/fail counts).
ACK_STATUS = {AckResult.DONE: 200, AckResult.LEASE_LOST: 409, AckResult.NOT_FOUND: 404}


def _single_limit(request: web.Request) -> tuple[int, dict[str, int]]:
    limit = request.app[SETTINGS].max_payload_bytes
    return limit + _ENVELOPE, {"max_payload_bytes": limit}


def _failure(
    job_id: UUID,
    lease_token: UUID,
    error: ErrorBody,
    retry_in: float | None,
    retry_after: RetryAfter | None,
) -> Failure:
    return Failure(
        job_id,
        lease_token,
        error.message,
        error.type,
        retryable=error.retryable,
        retry_in_seconds=retry_in if retry_after is None else retry_after.seconds,
        traceback=error.traceback,
        retry_after_key=None if retry_after is None else retry_after.limit_key,
    )


async def _claim_once(
    dispatch: Dispatch, body: ClaimRequest, queues: list[str], max_jobs: int
) -> list[JobDict]:
    """One claim query. If the request is cancelled (the worker went away) while the query
    runs, the query still finishes and whatever it claimed is released, not stranded until
    its lease runs out."""
    started = time.perf_counter()
    task = asyncio.ensure_future(
        dispatch.store.claim(
            worker_id=body.worker_id, queues=queues, max_jobs=max_jobs, types=body.types
        )
    )
    try:
        jobs = await asyncio.shield(task)
    except asyncio.CancelledError:
        await _release_undeliverable(dispatch, await task)
        raise
    dispatch.metrics.claim_latency.observe(time.perf_counter() - started)
    dispatch.metrics.claims.labels("jobs" if jobs else "empty").inc()
    return jobs


async def _claim_settling(
    dispatch: Dispatch,
    body: ClaimRequest,
    queues: list[str],
    settling: asyncio.Future[list[dict[str, Any]]],
) -> tuple[list[JobDict], list[dict[str, Any]]]:
    """The first claim of a request that carries outcomes, run while `settling` records them
    on another connection: completing one batch and claiming the next touch different rows,
    so PostgreSQL does both at once instead of one after the other (in a drain, where every
    claim carries the previous batch's outcomes, each is about half of the database's time
    per batch). The claim's snapshot may still count the settled jobs as running, so a claim
    that came back short runs once more after they are recorded, for the group, queue and
    limit slots they free: the answer is what claiming after the settle would have found."""
    try:
        jobs = await _claim_once(dispatch, body, queues, body.max_jobs)
    except BaseException:
        # The outcomes are recorded or not, as a whole; the worker sends them again either way.
        await asyncio.wait([settling])
        raise
    try:
        results = await asyncio.shield(settling)
    except BaseException:
        await _release_undeliverable(dispatch, jobs)
        raise
    if len(jobs) < body.max_jobs:
        try:
            jobs += await _claim_once(dispatch, body, queues, body.max_jobs - len(jobs))
        except BaseException:
            await _release_undeliverable(dispatch, jobs)
            raise
    return jobs, results


async def _release_undeliverable(dispatch: Dispatch, jobs: Sequence[JobDict]) -> None:
    if not jobs:
        return
    log.info("releasing %d claimed jobs whose worker left before the answer", len(jobs))
    dispatch.metrics.released_undeliverable.inc(len(jobs))
    await asyncio.gather(
        *(dispatch.store.release(j["id"], j["lease_token"]) for j in jobs),
        return_exceptions=True,
    )


def _claim_answer(jobs: list[JobDict], results: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"jobs": jobs} if results is None else {"jobs": jobs, "results": results}


async def _deliver(
    request: web.Request,
    dispatch: Dispatch,
    jobs: list[JobDict],
    results: list[dict[str, Any]] | None,
) -> web.StreamResponse:
    """Write the claimed jobs now, so a worker that is already gone is noticed here and its
    jobs go back to the queue at once."""
    response = json_response(_claim_answer(jobs, results))
    response.headers[REQUEST_ID_HEADER] = request[REQUEST_ID]
    transport = request.transport
    try:
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the worker disconnected")
        await response.prepare(request)
        await response.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        await _release_undeliverable(dispatch, jobs)
        raise
    # One counter update per queue, not per job: a claim hands out up to a thousand jobs.
    for queue, count in Counter(job["queue"] for job in jobs).items():
        dispatch.metrics.jobs_handed_out.labels(dispatch.metrics.queue_label(queue)).inc(count)
    return response


async def _deliver_traced(
    request: web.Request,
    dispatch: Dispatch,
    jobs: list[JobDict],
    results: list[dict[str, Any]] | None,
    worker_id: str,
    started: int,
) -> web.StreamResponse:
    """`_deliver` in a `claim` span, each job with the traceparent it was submitted with,
    if any. Traces are worth less than the claimed jobs: if they cannot be read, the jobs
    go out without them rather than wait for their leases to run out."""
    assert dispatch.tracer is not None
    from evora.tracing.spans import claim_span

    try:
        traceparents = await dispatch.store.traceparents([job["id"] for job in jobs])
    except asyncio.CancelledError:  # the worker went away: its jobs go back at once
        await _release_undeliverable(dispatch, jobs)
        raise
    except Exception:
        log.warning(
            "could not read the claimed jobs' traces; handing them out without", exc_info=True
        )
        traceparents = {}
    for job in jobs:
        traceparent = traceparents.get(job["id"])
        if traceparent is not None:
            job[TRACEPARENT] = traceparent
    with claim_span(dispatch.tracer, jobs, worker_id, started):
        return await _deliver(request, dispatch, jobs, results)


@routes.add(
    "POST",
    "/v1/claim",
    roles=("worker",),
    summary=(
        "Long-poll for up to max_jobs jobs; answers as soon as one is claimed. Outcomes in "
        "`acks` are recorded as by POST /v1/acks, while the claim runs."
    ),
    body=ClaimRequest,
    responses={200: ClaimResponse},
)
async def claim(request: web.Request) -> web.StreamResponse:
    # A claim may carry outcomes, so it is allowed the size of POST /v1/acks.
    body, encoded_results = await read_claim(request)
    dispatch = request.app[DISPATCH]
    # Outcomes are recorded while the first claim runs (`_claim_settling`), and that claim
    # sees the slots they free; a claim that then finds nothing still answers them at once,
    # not after the wait.
    settling = (
        asyncio.ensure_future(_settle(dispatch, body.acks, encoded_results)) if body.acks else None
    )
    results: list[dict[str, Any]] | None = None if body.acks is None else []
    queues = list(dict.fromkeys(body.queues))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body.wait_seconds
    shape = (tuple(queues), tuple(body.types) if body.types else None)
    waiter = dispatch.wakeups.register(queues)
    dispatch.metrics.waiting.enter(queues)
    try:
        # Recorded outcomes may have freed limited slots: the queue is worth asking again.
        skip = not body.acks and dispatch.wakeups.drained(shape)
        while not dispatch.wakeups.closing:
            hints = dispatch.wakeups.hints(queues)
            claim_started = time.time_ns()
            jobs: list[JobDict]
            if skip:
                jobs, skip = [], False
                dispatch.metrics.claims.labels("skipped").inc()
            else:
                if settling is not None:
                    jobs, results = await _claim_settling(dispatch, body, queues, settling)
                    settling = None
                else:
                    jobs = await _claim_once(dispatch, body, queues, body.max_jobs)
                dispatch.wakeups.claimed(shape, hints, short=len(jobs) < body.max_jobs)
            if jobs:
                if len(jobs) == body.max_jobs:
                    dispatch.wakeups.chain(queues)
                if dispatch.tracer is not None:
                    return await _deliver_traced(
                        request, dispatch, jobs, results, body.worker_id, claim_started
                    )
                return await _deliver(request, dispatch, jobs, results)
            # The waiter stays in its queues' lines while it claims, so a hint for a job the
            # claim could not see yet wakes it (or another waiter) instead of going unheard.
            if not waiter.future.done():
                cause = await dispatch.wakeups.wait(waiter, deadline - loop.time())
                if cause is None or cause is Cause.SHUTDOWN:
                    break
            dispatch.wakeups.rearm(waiter)
        if settling is not None:  # shutting down before the first claim
            results = await settling
        return json_response(_claim_answer([], results))
    finally:
        future = waiter.future
        woken_unused = (
            future.done() and not future.cancelled() and future.result() is not Cause.SHUTDOWN
        )
        dispatch.wakeups.leave(waiter, woken_unused=woken_unused)
        dispatch.metrics.waiting.leave(queues)


@routes.add(
    "POST",
    "/v1/jobs/{id}/heartbeat",
    roles=("worker",),
    summary="Extend the lease; tells whether cancellation was requested, and whether the "
    "attempt ran past its max_duration_seconds.",
    body=HeartbeatRequest,
    responses={200: HeartbeatResponse},
    problems=(404, 409),
)
async def heartbeat(request: web.Request) -> web.Response:
    job_id = ids.job_id(request.match_info["id"])
    limit, context = _single_limit(request)
    body = await parse_body(request, HeartbeatRequest, limit=limit, context=context)
    beat = await request.app[DISPATCH].store.heartbeat(
        job_id, body.lease_token, lease_seconds=body.lease_seconds, progress=body.progress
    )
    return json_response(
        {
            "lease_expires_at": beat.lease_expires_at,
            "cancel_requested": beat.cancel_requested,
            "timeout_requested": beat.timeout_requested,
        }
    )


@routes.add(
    "POST",
    "/v1/jobs/{id}/complete",
    roles=("worker",),
    summary="Complete the job with an optional result (repeating with the same token is safe).",
    body=CompleteRequest,
    responses={200: Job},
    problems=(404, 409),
)
async def complete(request: web.Request) -> web.Response:
    job_id = ids.job_id(request.match_info["id"])
    limit, context = _single_limit(request)
    body = await parse_body(request, CompleteRequest, limit=limit, context=context)
    dispatch = request.app[DISPATCH]
    outcome = await dispatch.completions.submit(Completion(job_id, body.lease_token, body.result))
    dispatch.metrics.acks.labels("complete", str(ACK_STATUS[outcome.result])).inc()
    return json_response(outcome.job_or_raise())


@routes.add(
    "POST",
    "/v1/jobs/{id}/fail",
    roles=("worker",),
    summary="Fail the attempt: retried with backoff (or after an upstream's retry-after, "
    "uncounted), dead-lettered, or cancelled.",
    body=FailRequest,
    responses={200: Job},
    problems=(404, 409),
)
async def fail(request: web.Request) -> web.Response:
    job_id = ids.job_id(request.match_info["id"])
    limit, _ = _single_limit(request)
    body = await parse_body(request, FailRequest, limit=limit)
    dispatch = request.app[DISPATCH]
    failure = _failure(
        job_id, body.lease_token, body.error, body.retry_in_seconds, body.retry_after
    )
    outcome = await dispatch.failures.submit(failure)
    dispatch.metrics.acks.labels("fail", str(ACK_STATUS[outcome.result])).inc()
    return json_response(outcome.job_or_raise())


@routes.add(
    "POST",
    "/v1/jobs/{id}/release",
    roles=("worker",),
    summary="Hand the job back without using up an attempt.",
    body=ReleaseRequest,
    responses={200: Job},
    problems=(404, 409),
)
async def release(request: web.Request) -> web.Response:
    job_id = ids.job_id(request.match_info["id"])
    body = await parse_body(request, ReleaseRequest, limit=CLAIM_BODY_LIMIT)
    job = await request.app[DISPATCH].store.release(
        job_id, body.lease_token, delay_seconds=body.delay_seconds or 0.0
    )
    return json_response(job)


@routes.add(
    "POST",
    "/v1/jobs/{id}/snooze",
    roles=("worker",),
    summary="Run the job again after a delay, without using up an attempt (event `snoozed`).",
    body=SnoozeRequest,
    responses={200: Job},
    problems=(404, 409),
)
async def snooze(request: web.Request) -> web.Response:
    job_id = ids.job_id(request.match_info["id"])
    body = await parse_body(request, SnoozeRequest, limit=CLAIM_BODY_LIMIT)
    job = await request.app[DISPATCH].store.snooze(
        job_id, body.lease_token, delay_seconds=body.delay_seconds
    )
    return json_response(job)


@routes.add(
    "POST",
    "/v1/jobs/{id}/checkpoints",
    roles=("worker",),
    summary="Record a step's result on the job (event `checkpointed`), handed to its next "
    "attempt; fenced by the lease.",
    body=CheckpointRequest,
    responses={200: CheckpointResponse},
    problems=(404, 409, 413),
)
async def checkpoint(request: web.Request) -> web.Response:
    job_id = ids.job_id(request.match_info["id"])
    limit, context = _single_limit(request)
    body = await parse_body(request, CheckpointRequest, limit=limit, context=context)
    stored = await checkpoints.record(
        request.app[DISPATCH].store.pool, job_id, body.lease_token, body.name, body.data
    )
    return json_response({"checkpoints": stored})


@routes.add(
    "POST",
    "/v1/jobs/{id}/suspend",
    roles=("worker",),
    summary=(
        "Suspend the job on a callback (docs/callbacks.md): it holds no lease and no limit slot "
        "until the callback is resolved (POST /v1/callbacks/{callback_id}) or times out."
    ),
    body=SuspendRequest,
    responses={200: SuspendResponse},
    problems=(404, 409),
)
async def suspend(request: web.Request) -> web.Response:
    job_id = ids.job_id(request.match_info["id"])
    body = await parse_body(request, SuspendRequest, limit=CLAIM_BODY_LIMIT)
    suspended = await request.app[DISPATCH].store.suspend(
        job_id, body.lease_token, timeout_seconds=body.timeout_seconds, on_timeout=body.on_timeout
    )
    return json_response({"callback_id": suspended.callback_id, "job": suspended.job})


@routes.add(
    "POST",
    "/v1/jobs/{id}/children",
    roles=("worker",),
    summary=(
        "Submit the job's children and wait for them (docs/jobs-that-wait.md): in one "
        "transaction the children are stored and the job becomes WAITING on them, holding no "
        "lease and no limit slot, its attempt uncounted; its next claim carries their results."
    ),
    body=ChildrenRequest,
    responses={200: ChildrenResponse},
    problems=(404, 409, 422, 429),
)
async def children(request: web.Request) -> web.Response:
    job_id = ids.job_id(request.match_info["id"])
    settings = request.app[SETTINGS]
    body = await parse_body(
        request,
        ChildrenRequest,
        limit=items_limit(settings.max_payload_bytes),
        context={"max_payload_bytes": settings.max_payload_bytes},
    )
    spawned = await request.app[DISPATCH].store.spawn_children(
        job_id, body.lease_token, body.jobs, on_dependency_failure=body.on_dependency_failure
    )
    return json_response(
        {
            "job": spawned.job,
            "children": [
                {"id": child.id, "status": 201 if child.created else 200}
                for child in spawned.children
            ],
        }
    )


@routes.add(
    "POST",
    "/v1/acks",
    roles=("worker",),
    summary="Complete or fail many jobs at once; one status per item.",
    body=AcksRequest,
    responses={200: AcksResponse},
)
async def acks(request: web.Request) -> web.Response:
    body, encoded_results = await read_acks(request)
    return json_response(
        {"results": await _settle(request.app[DISPATCH], body.acks, encoded_results)}
    )


async def _settle(
    dispatch: Dispatch, items: Sequence[Ack], encoded_results: Sequence[orjson.Fragment]
) -> list[dict[str, Any]]:
    """Record the outcomes of `POST /v1/acks` (or of a claim's `acks`) through the fenced
    batch statements; one status per item, in order, each as if it had been sent alone.
    Completions go as columns, with no object per item: they are nearly every ack."""
    ids: list[UUID] = []
    tokens: list[UUID] = []
    results: list[orjson.Fragment] = []
    failures: list[Failure] = []
    for ack, result in zip(items, encoded_results, strict=True):
        if ack.outcome == "complete":
            ids.append(ack.id)
            tokens.append(ack.lease_token)
            results.append(result)
        elif ack.error is not None:  # always, for a fail: the model requires it
            failures.append(
                _failure(ack.id, ack.lease_token, ack.error, ack.retry_in_seconds, ack.retry_after)
            )
    completed = [
        ACK_STATUS[r] for r in await dispatch.store.settle_completions(ids, tokens, results)
    ]
    failed = [
        ACK_STATUS[o.result] for o in await dispatch.store.fail_many(failures, with_jobs=False)
    ]
    _count_acks(dispatch, "complete", completed)
    _count_acks(dispatch, "fail", failed)
    if failed:
        completes, fails = iter(completed), iter(failed)
        statuses = [next(completes if ack.outcome == "complete" else fails) for ack in items]
    else:
        statuses = completed
    return [{"id": ack.id, "status": status} for ack, status in zip(items, statuses, strict=True)]


def _count_acks(dispatch: Dispatch, kind: str, statuses: list[int]) -> None:
    # One counter update per status, not per item.
    for status, count in Counter(statuses).items():
        dispatch.metrics.acks.labels(kind, str(status)).inc(count)
