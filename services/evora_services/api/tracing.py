"""The trace context of submissions: the producer's `traceparent` header, checked, and the
api's `submit` span when the process traces (evora.tracing). Without tracing the
producer's context is stored as given, so a traced producer and worker still share a trace."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from evora.domain.errors import EvoraError
from evora.http.app import TRACER
from evora.protocol.jobs import JobSubmission
from evora.protocol.tracing import TRACEPARENT
from evora.storage.jobs import JobStore, RequestsFlush
from evora.storage.submissions import Submitted
from evora.tracing.traceparent import valid_traceparent

if TYPE_CHECKING:
    from evora.tracing.spans import SubmitSpan

# A submission and the traceparent its job is stored with.
TracedSubmission = tuple[JobSubmission, str | None]


def traced_submitter(store: JobStore) -> RequestsFlush[TracedSubmission, Submitted | EvoraError]:
    """What the submission coalescer flushes with: one statement for all, traces kept."""

    async def submit_each(
        items: Sequence[TracedSubmission], /, *, brief_lock_waits: bool = False
    ) -> list[Submitted | EvoraError]:
        return await store.submit_each(
            [s for s, _ in items], [t for _, t in items], brief_lock_waits=brief_lock_waits
        )

    return submit_each


@dataclass(frozen=True)
class SubmitTrace:
    traceparent: str | None  # what the created jobs are stored with
    span: SubmitSpan | None

    def record(self, submitted: Sequence[Submitted]) -> None:
        if self.span is not None:
            self.span.record(submitted)


@contextmanager
def submit_trace(
    request: web.Request, submissions: Sequence[JobSubmission]
) -> Iterator[SubmitTrace]:
    incoming = valid_traceparent(request.headers.get(TRACEPARENT))
    tracer = request.app[TRACER]
    if tracer is None:
        yield SubmitTrace(incoming, None)
        return
    from evora.tracing.spans import submit_span

    with submit_span(tracer, incoming, submissions) as span:
        yield SubmitTrace(span.traceparent, span)
