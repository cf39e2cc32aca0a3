"""The SDK's spans (evora.sdk.tracing), imported only once the application has imported
OpenTelemetry; they go to the application's global tracer provider."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from evora.protocol import tracing as names
from evora.sdk.tracing import JobTrace

if TYPE_CHECKING:
    from evora.sdk.handlers import Job

_W3C = TraceContextTextMapPropagator()
# A proxy until the application sets its provider, then that provider's tracer.
_tracer = trace.get_tracer("evora.sdk")


def current_traceparent() -> str | None:
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier.get(names.TRACEPARENT)


def _job_attributes(job: Job) -> dict[str, AttributeValue]:
    return {
        names.DESTINATION: job.queue,
        names.MESSAGE_ID: job.id,
        names.JOB_TYPE: job.type,
        names.JOB_ATTEMPT: job.attempt,
    }


class _RunTrace(JobTrace):
    def __init__(self, span: Span, job: Job) -> None:
        self._span = span
        self._job = job

    def ended(self, outcome: str) -> None:
        self._span.set_attribute(names.JOB_OUTCOME, outcome)

    def ack(self, outcome: str) -> AbstractContextManager[object]:
        attributes = names.operation(names.ACK) | _job_attributes(self._job)
        attributes[names.JOB_OUTCOME] = outcome
        return _tracer.start_as_current_span(names.ACK, kind=SpanKind.CLIENT, attributes=attributes)


@contextmanager
def run_span(job: Job) -> Iterator[JobTrace]:
    traceparent = job.data.get(names.TRACEPARENT)
    parent = None if traceparent is None else _W3C.extract({names.TRACEPARENT: traceparent})
    with _tracer.start_as_current_span(
        names.RUN,
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=names.operation(names.RUN) | _job_attributes(job),
    ) as span:
        yield _RunTrace(span, job)
