"""OpenTelemetry in the SDK (docs/tracing.md): the producer's trace context sent with its
submissions, and the worker's `run` and `ack` spans in the context a job was submitted in.

Only an application that has imported OpenTelemetry can have a span active or a tracer
provider set, so until `opentelemetry.trace` is imported this costs one dictionary lookup
and imports nothing: the SDK does not depend on OpenTelemetry.
"""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager, nullcontext
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
        return _NO_SPAN


_NO_SPAN = nullcontext()


class _Untraced(AbstractContextManager[JobTrace]):
    """`job_trace` without OpenTelemetry: one shared instance, so that a job costs no
    context manager of its own."""

    def __enter__(self) -> JobTrace:
        return _UNTRACED

    def __exit__(self, *exc_info: object) -> None:
        return None


_UNTRACED = JobTrace()
_UNTRACED_RUN = _Untraced()


def job_trace(job: Job) -> AbstractContextManager[JobTrace]:
    """Around running `job` and reporting how it ended: the `run` span, a child of the
    context the job was submitted in (or of the current one when it carries none)."""
    if not _traced():
        return _UNTRACED_RUN
    from evora.sdk._otel import run_span

    return run_span(job)
