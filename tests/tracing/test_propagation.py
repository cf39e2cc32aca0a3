"""One trace from a producer's span to the worker's: the SDK sends the active context as
`traceparent`, the api's `submit` span is its child and is stored with the job, the
dispatcher's `claim` span links to it and hands it out, and the worker's `run` span (with
the handler's own spans under it) and `ack` span continue it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp
import orjson
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from evora import Handlers, Job, tracing
from tests.e2e.conftest import WORKER_HEADERS, Stack
from tests.servers import PRODUCER_TOKEN, start_api, start_dispatcher
from tests.tracing.conftest import named

PRODUCER_HEADERS = {"Authorization": f"Bearer {PRODUCER_TOKEN}"}
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"

tracer = trace.get_tracer("tests.tracing")


async def _wait_for(spans: InMemorySpanExporter, stack: Stack, name: str, count: int) -> None:
    await stack.until(
        lambda: len(named(spans, name)) >= count, within=30, what=f"{count} {name} span(s)"
    )


async def test_one_trace_from_producer_through_submit_claim_run_and_ack(
    traced_stack: Stack, spans: InMemorySpanExporter
) -> None:
    stack = traced_stack
    handlers = Handlers()

    @handlers.job("trace.echo")
    async def echo(job: Job) -> Any:
        with tracer.start_as_current_span("handler work"):
            await asyncio.sleep(0)
        return job.payload

    with tracer.start_as_current_span("produce") as producer:
        submitted = await stack.client.submit("traced", "trace.echo", {"n": 1})
    stack.start(stack.worker(handlers, ["traced"]))
    await stack.wait_for_states("traced", {"COMPLETED": 1}, within=30)
    await _wait_for(spans, stack, "ack", 1)

    trace_id = producer.get_span_context().trace_id
    (submit,) = named(spans, "submit")
    (claim,) = named(spans, "claim")
    (run,) = named(spans, "run")
    (ack,) = named(spans, "ack")
    (work,) = named(spans, "handler work")

    assert submit.context.trace_id == trace_id
    assert submit.parent is not None
    assert submit.parent.span_id == producer.get_span_context().span_id
    assert submit.kind is SpanKind.PRODUCER
    assert submit.attributes is not None
    assert submit.attributes["messaging.system"] == "evora"
    assert submit.attributes["messaging.operation.type"] == "send"
    assert submit.attributes["messaging.destination.name"] == "traced"
    assert submit.attributes["messaging.message.id"] == submitted.id
    assert submit.attributes["evora.job.type"] == "trace.echo"
    assert submit.attributes["evora.job.outcome"] == "created"

    # The claim is a trace of its own (it may serve jobs of many), linked to the job's.
    assert claim.context.trace_id != trace_id
    assert claim.kind is SpanKind.CONSUMER
    assert [(link.context.trace_id, link.context.span_id) for link in claim.links] == [
        (trace_id, submit.context.span_id)
    ]
    assert claim.links[0].attributes == {"messaging.message.id": submitted.id}
    assert claim.attributes is not None
    assert claim.attributes["messaging.batch.message_count"] == 1
    assert claim.attributes["messaging.client.id"] == stack._workers[0][0].settings.worker_id

    assert run.context.trace_id == trace_id
    assert run.parent is not None
    assert run.parent.span_id == submit.context.span_id
    assert run.kind is SpanKind.CONSUMER
    assert run.attributes is not None
    assert run.attributes["messaging.message.id"] == submitted.id
    assert run.attributes["messaging.destination.name"] == "traced"
    assert run.attributes["evora.job.type"] == "trace.echo"
    assert run.attributes["evora.job.attempt"] == 1
    assert run.attributes["evora.job.outcome"] == "complete"

    assert work.parent is not None
    assert work.parent.span_id == run.context.span_id
    assert ack.parent is not None
    assert ack.parent.span_id == run.context.span_id
    assert ack.context.trace_id == trace_id
    assert ack.attributes is not None
    assert ack.attributes["evora.job.outcome"] == "complete"


async def test_a_failed_attempt_and_its_retry_run_in_the_submitted_trace(
    traced_stack: Stack, spans: InMemorySpanExporter
) -> None:
    stack = traced_stack
    handlers = Handlers()

    @handlers.job("trace.flaky")
    async def flaky(job: Job) -> None:
        if job.attempt == 1:
            raise RuntimeError("first attempt fails")

    with tracer.start_as_current_span("produce") as producer:
        await stack.client.submit("traced-retry", "trace.flaky", backoff={"initial_seconds": 0.01})
    stack.start(stack.worker(handlers, ["traced-retry"]))
    await stack.wait_for_states("traced-retry", {"COMPLETED": 1}, within=30)
    await _wait_for(spans, stack, "ack", 2)

    runs = sorted(named(spans, "run"), key=lambda s: s.start_time or 0)
    assert [r.attributes and r.attributes["evora.job.attempt"] for r in runs] == [1, 2]
    assert [r.attributes and r.attributes["evora.job.outcome"] for r in runs] == [
        "fail",
        "complete",
    ]
    assert {r.context.trace_id for r in runs} == {producer.get_span_context().trace_id}


async def test_a_batch_carries_the_producers_trace_to_every_job(
    traced_stack: Stack, spans: InMemorySpanExporter
) -> None:
    stack = traced_stack
    with tracer.start_as_current_span("produce") as producer:
        await stack.client.submit_batch(
            [{"queue": "traced-batch", "type": "t", "payload": i} for i in range(3)]
        )
    (submit,) = named(spans, "submit")
    assert submit.parent is not None
    assert submit.parent.span_id == producer.get_span_context().span_id
    assert submit.attributes is not None
    assert submit.attributes["messaging.batch.message_count"] == 3

    jobs = await _claim_raw(stack, "traced-batch", 3)
    assert [job["traceparent"] for job in jobs] == [_traceparent(submit)] * 3


def _traceparent(span: ReadableSpan) -> str:
    context = span.context
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


async def _claim_raw(stack: Stack, queue: str, max_jobs: int) -> list[dict[str, Any]]:
    body = await _claim_bytes(stack, queue, max_jobs)
    jobs: list[dict[str, Any]] = orjson.loads(body)["jobs"]
    assert len(jobs) == max_jobs
    return jobs


async def _claim_bytes(stack: Stack, queue: str, max_jobs: int) -> bytes:
    async with stack.http.post(
        stack.dispatcher_url + "/v1/claim",
        json={"worker_id": "raw", "queues": [queue], "max_jobs": max_jobs, "wait_seconds": 5},
        headers=WORKER_HEADERS,
    ) as response:
        assert response.status == 200
        return await response.read()


async def _submit_raw(stack: Stack, queue: str, **headers: str) -> tuple[int, str]:
    async with stack.http.post(
        stack.api.url + "/v1/jobs",
        json={"queue": queue, "type": "t"},
        headers=PRODUCER_HEADERS | headers,
    ) as response:
        data = await response.json()
        return response.status, str(data["id"])


async def _stored(stack: Stack, job_id: str) -> str | None:
    value: str | None = await stack.pool.fetchval(
        "SELECT traceparent FROM evora.job_traces WHERE job_id = $1", uuid.UUID(job_id)
    )
    return value


async def test_a_malformed_traceparent_is_ignored_never_stored_nor_refused(
    traced_stack: Stack, spans: InMemorySpanExporter
) -> None:
    stack = traced_stack
    malformed = TRACEPARENT.replace("-01", "-0x")
    status, job_id = await _submit_raw(stack, "malformed", traceparent=malformed)
    assert status == 201
    # the api's span starts a trace of its own instead, which the job carries
    (submit,) = named(spans, "submit")
    assert submit.parent is None
    assert submit.context.trace_id != int(TRACE_ID, 16)
    assert await _stored(stack, job_id) == _traceparent(submit)
    (job,) = await _claim_raw(stack, "malformed", 1)
    assert job["traceparent"] == _traceparent(submit)


async def test_without_tracing_the_producers_traceparent_is_stored_as_sent(
    untraced_stack: Stack, spans: InMemorySpanExporter
) -> None:
    stack = untraced_stack
    status, job_id = await _submit_raw(stack, "as-sent", traceparent=TRACEPARENT)
    assert status == 201
    assert await _stored(stack, job_id) == TRACEPARENT
    status, other = await _submit_raw(stack, "as-sent", traceparent="00-" + "0" * 32 + "-0f-01")
    assert status == 201
    assert await _stored(stack, other) is None
    assert named(spans, "submit") == []


async def test_untraced_dispatcher_answers_claims_without_traces_even_when_jobs_have_them(
    untraced_stack: Stack,
) -> None:
    stack = untraced_stack
    _, job_id = await _submit_raw(stack, "wire", traceparent=TRACEPARENT)
    assert await _stored(stack, job_id) == TRACEPARENT
    body = await _claim_bytes(stack, "wire", 1)
    assert b"traceparent" not in body
    assert job_id.encode() in body


async def test_a_job_submitted_without_trace_is_claimed_without_one(
    db_url: str, provider: TracerProvider, spans: InMemorySpanExporter
) -> None:
    # an api that does not trace stores only what producers send; the dispatcher traces
    api = await start_api(db_url)
    tracing.use_provider(provider)
    try:
        dispatcher = await start_dispatcher(db_url)
    finally:
        tracing.use_provider(None)
    try:
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"traceparent": TRACEPARENT}):
                async with http.post(
                    api.url + "/v1/jobs",
                    json={"queue": "mixed", "type": "t"},
                    headers=PRODUCER_HEADERS | headers,
                ) as response:
                    assert response.status == 201
            async with http.post(
                dispatcher.url + "/v1/claim",
                json={"worker_id": "raw", "queues": ["mixed"], "max_jobs": 2},
                headers=WORKER_HEADERS,
            ) as response:
                jobs = (await response.json())["jobs"]
    finally:
        await dispatcher.close()
        await api.close()
    assert [job.get("traceparent") for job in jobs] == [None, TRACEPARENT]
    assert "traceparent" not in jobs[0]  # absent, not null: the wire of untraced jobs
    (claim,) = named(spans, "claim")
    assert [link.context.span_id for link in claim.links] == [0x00F067AA0BA902B7]


async def test_a_replay_keeps_the_original_trace_and_writes_none(untraced_stack: Stack) -> None:
    stack = untraced_stack
    first = {"traceparent": TRACEPARENT}
    async with stack.http.post(
        stack.api.url + "/v1/jobs",
        json={"queue": "replay", "type": "t", "idempotency_key": "k"},
        headers=PRODUCER_HEADERS | first,
    ) as response:
        assert response.status == 201
        job_id = str((await response.json())["id"])
    other = TRACEPARENT.replace("00f067aa0ba902b7", "1111111111111111")
    async with stack.http.post(
        stack.api.url + "/v1/jobs",
        json={"queue": "replay", "type": "t", "idempotency_key": "k"},
        headers=PRODUCER_HEADERS | {"traceparent": other},
    ) as response:
        assert response.status == 200
    assert await _stored(stack, job_id) == TRACEPARENT
    assert await stack.pool.fetchval("SELECT count(*) FROM evora.job_traces") == 1


async def test_concurrent_submissions_keep_each_its_own_trace(untraced_stack: Stack) -> None:
    stack = untraced_stack
    parents = [f"00-{TRACE_ID}-{i + 1:016x}-01" for i in range(20)]
    results = await asyncio.gather(
        *(
            _submit_raw(stack, "concurrent", **({"traceparent": p} if i % 2 else {}))
            for i, p in enumerate(parents)
        )
    )
    for i, (status, job_id) in enumerate(results):
        assert status == 201
        assert await _stored(stack, job_id) == (parents[i] if i % 2 else None)


async def test_jobs_go_out_without_traces_when_those_cannot_be_read(
    traced_stack: Stack, caplog: pytest.LogCaptureFixture
) -> None:
    stack = traced_stack
    _, job_id = await _submit_raw(stack, "unreadable", traceparent=TRACEPARENT)
    await stack.pool.execute("ALTER TABLE evora.job_traces RENAME TO job_traces_away")
    try:
        (job,) = await _claim_raw(stack, "unreadable", 1)
    finally:
        await stack.pool.execute("ALTER TABLE evora.job_traces_away RENAME TO job_traces")
    assert job["id"] == job_id
    assert "traceparent" not in job
    assert "could not read the claimed jobs' traces" in caplog.text
