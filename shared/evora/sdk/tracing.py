"""OpenTelemetry in the SDK (docs/tracing.md): the producer's trace context sent with its
submissions, and the worker's `run` and `ack` spans in the context a job was submitted in.

Only an application that has imported OpenTelemetry can have a span active or a tracer
provider set, so until `opentelemetry.trace` is imported this costs one dictionary lookup
and imports nothing: the SDK does not depend on OpenTelemetry.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING

from evora.protocol.tracing import TRACEPARENT

if TYPE_CHECKING:
    from evora.sdk.handlers import Job


def _traced() -> bool:
    return "opentelemetry.trace" in sys.modules


def context_headers() -> dict[str, str] | None:
    """The `traceparent` header of the active span, if any: sent with a submission, it is
    stored with the jobs and handed to the worker that runs them."""
    if not _traced():
        return None
    from evora.sdk._otel import current_traceparent

    traceparent = current_traceparent()
    return None if traceparent is None else {TRACEPARENT: traceparent}


class JobTrace:
    """The spans of one job in the worker; this base, used without OpenTelemetry, records
    nothing."""

    def ended(self, outcome: str) -> None:
        """The handler ended with `outcome` (complete, fail, release or abandon)."""

    def ack(self, outcome: str) -> AbstractContextManager[object]:
        """Around reporting the outcome until the dispatcher has recorded it."""
        return nullcontext()


_UNTRACED = JobTrace()


@contextmanager
def job_trace(job: Job) -> Iterator[JobTrace]:
    """Around running `job` and reporting how it ended: the `run` span, a child of the
    context the job was submitted in (or of the current one when it carries none)."""
    if not _traced():
        yield _UNTRACED
        return
    from evora.sdk._otel import run_span

    with run_span(job) as trace:
        yield trace
