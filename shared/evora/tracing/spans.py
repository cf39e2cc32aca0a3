"""The api's `submit` and the dispatcher's `claim` spans (imported only when the process
traces: see evora.tracing)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from evora.protocol import tracing as names
from evora.protocol.jobs import JobSubmission
from evora.storage.rows import JobDict
from evora.storage.submissions import Submitted

_W3C = TraceContextTextMapPropagator()


def context_of(traceparent: str | None) -> Context | None:
    return None if traceparent is None else _W3C.extract({names.TRACEPARENT: traceparent})


def _queue(queues: set[str]) -> dict[str, AttributeValue]:
    # a span over several queues has no one destination
    return {names.DESTINATION: next(iter(queues))} if len(queues) == 1 else {}


@dataclass(frozen=True)
class SubmitSpan:
    span: Span
    traceparent: str  # the span's own context, stored with the jobs it creates

    def record(self, submitted: Sequence[Submitted]) -> None:
        if len(submitted) == 1:
            self.span.set_attributes(
                {
                    names.MESSAGE_ID: str(submitted[0].id),
                    names.JOB_OUTCOME: "created" if submitted[0].created else "replayed",
                }
            )


@contextmanager
def submit_span(
    tracer: Tracer, incoming: str | None, submissions: Sequence[JobSubmission]
) -> Iterator[SubmitSpan]:
    """The span of one submit request, a child of the producer's `incoming` context."""
    attributes: dict[str, AttributeValue] = names.operation(names.SUBMIT) | _queue(
        {s.queue for s in submissions}
    )
    if len(submissions) == 1:
        attributes[names.JOB_TYPE] = submissions[0].type
    else:
        attributes[names.MESSAGE_COUNT] = len(submissions)
    with tracer.start_as_current_span(
        names.SUBMIT, context=context_of(incoming), kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        _W3C.inject(carrier)
        yield SubmitSpan(span, carrier[names.TRACEPARENT])


@contextmanager
def claim_span(
    tracer: Tracer, jobs: Sequence[JobDict], worker_id: str, start_time: int
) -> Iterator[Span]:
    """The span of a claim that handed out `jobs`, from `start_time` (ns since the epoch),
    linked to the context each job was submitted in. It starts a trace of its own: one
    claim serves jobs of many traces."""
    links = []
    for job in jobs:
        context = context_of(job.get(names.TRACEPARENT))
        if context is not None:
            span_context = trace.get_current_span(context).get_span_context()
            links.append(Link(span_context, {names.MESSAGE_ID: str(job["id"])}))
    attributes: dict[str, AttributeValue] = names.operation(names.CLAIM) | _queue(
        {job["queue"] for job in jobs}
    )
    attributes[names.MESSAGE_COUNT] = len(jobs)
    attributes[names.CLIENT_ID] = worker_id
    with tracer.start_as_current_span(
        names.CLAIM,
        context=Context(),
        kind=SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        start_time=start_time,
    ) as span:
        yield span
