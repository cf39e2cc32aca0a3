"""Exceptions of the SDK.

Calls that fail raise an `EvoraClientError`: an `EvoraHTTPError` when a service answered with
an RFC 9457 problem (docs/http-api.md#errors), an `EvoraConnectionError` when no answer arrived.
HTTP errors are mapped to a subclass by the problem's stable `code` first and by the HTTP
status second, so `except JobNotFoundError` keeps working even if a proxy in between answers
without a problem body, and `except ConflictError` catches every 409.

Handlers use `NonRetryable` (or any exception with `retryable = False`) to fail a job without
retrying it, and `JobCancelled` to stop work when cancellation was requested.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

from evora.protocol import problems


class EvoraClientError(Exception):
    """A call to an Evora service did not succeed.

    `attempts` is how many times the request was sent before giving up (1 when it was not
    retried)."""

    def __init__(self, message: str, *, attempts: int = 1) -> None:
        super().__init__(message)
        self.attempts = attempts


class EvoraConnectionError(EvoraClientError):
    """No HTTP answer: the connection failed, broke, or timed out.

    `request_sent` is False only when the request certainly never reached the server (the
    connection could not be established), which makes even a non-idempotent call safe to
    repeat."""

    def __init__(self, message: str, *, request_sent: bool, attempts: int = 1) -> None:
        super().__init__(message, attempts=attempts)
        self.request_sent = request_sent


class EvoraHTTPError(EvoraClientError):
    """The service answered with an error status; the members of its problem body are kept.

    `errors` holds the `[{"loc": [...], "msg": ...}]` of validation problems and is empty
    otherwise; `body` is the whole decoded problem (or None when it was not JSON)."""

    problem_code: ClassVar[str | None] = None
    problem_status: ClassVar[int | None] = None

    def __init__(
        self,
        status: int,
        *,
        code: str,
        title: str,
        detail: str | None = None,
        type: str = "about:blank",
        errors: list[dict[str, Any]] | None = None,
        body: Any = None,
        attempts: int = 1,
    ) -> None:
        super().__init__(f"{status} {code}: {detail or title}", attempts=attempts)
        self.status = status
        self.code = code
        self.title = title
        self.detail = detail
        self.type = type
        self.errors = errors or []
        self.body = body


class BadRequestError(EvoraHTTPError):
    problem_status = 400


class MalformedJSONError(BadRequestError):
    problem_code = problems.MALFORMED_JSON


class UnauthorizedError(EvoraHTTPError):
    """The token is missing or unknown."""

    problem_code = problems.UNAUTHORIZED
    problem_status = 401


class ForbiddenError(EvoraHTTPError):
    """The token's role may not call this endpoint."""

    problem_code = problems.FORBIDDEN
    problem_status = 403


class NotFoundError(EvoraHTTPError):
    problem_status = 404


class JobNotFoundError(NotFoundError):
    problem_code = problems.JOB_NOT_FOUND


class QueueNotFoundError(NotFoundError):
    problem_code = problems.QUEUE_NOT_FOUND


class ScheduleNotFoundError(NotFoundError):
    problem_code = problems.SCHEDULE_NOT_FOUND


class LimitNotFoundError(NotFoundError):
    problem_code = problems.LIMIT_NOT_FOUND


class CallbackNotFoundError(NotFoundError):
    problem_code = problems.CALLBACK_NOT_FOUND


class ConflictError(EvoraHTTPError):
    problem_status = 409


class CallbackSettledError(ConflictError):
    """The callback timed out, or its job was cancelled: it can no longer be resolved."""

    problem_code = problems.CALLBACK_SETTLED


class LeaseLostError(ConflictError):
    """The lease token is no longer the job's current lease."""

    problem_code = problems.LEASE_LOST


class InvalidStateError(ConflictError):
    """The job is not in a state that allows the operation."""

    problem_code = problems.INVALID_STATE


class IdempotencyConflictError(ConflictError):
    """The idempotency key was already used for the queue with different fields."""

    problem_code = problems.IDEMPOTENCY_CONFLICT


class IdempotentJobGoneError(ConflictError):
    """The idempotency key was used, but retention has since removed its job."""

    problem_code = problems.IDEMPOTENT_JOB_GONE


class QueueFullError(EvoraHTTPError):
    """A key the submission holds is at its max_pending (docs/flow-control.md, "Admission"):
    nothing was stored. Retry after the `Retry-After` seconds the answer carries, or ask the
    key's room first (`Client.room`)."""

    problem_code = problems.QUEUE_FULL
    problem_status = 429


class PayloadTooLargeError(EvoraHTTPError):
    problem_code = problems.PAYLOAD_TOO_LARGE
    problem_status = 413


class RequestValidationError(EvoraHTTPError):
    """The request broke a rule; `errors` says where."""

    problem_code = problems.VALIDATION_ERROR
    problem_status = 422


class ServerError(EvoraHTTPError):
    """Any 5xx answer."""


_CLASSES: tuple[type[EvoraHTTPError], ...] = (
    BadRequestError,
    MalformedJSONError,
    UnauthorizedError,
    ForbiddenError,
    NotFoundError,
    JobNotFoundError,
    QueueNotFoundError,
    ScheduleNotFoundError,
    LimitNotFoundError,
    CallbackNotFoundError,
    ConflictError,
    LeaseLostError,
    InvalidStateError,
    CallbackSettledError,
    IdempotencyConflictError,
    IdempotentJobGoneError,
    QueueFullError,
    PayloadTooLargeError,
    RequestValidationError,
)
_BY_CODE = {cls.problem_code: cls for cls in _CLASSES if cls.problem_code}
# The most general class per status: the one whose status is its own, not inherited.
_BY_STATUS = {
    cls.problem_status: cls
    for cls in _CLASSES
    if cls.problem_status and "problem_status" in vars(cls)
}


def error_class(status: int, code: str | None) -> type[EvoraHTTPError]:
    """The exception class for an error answer: by `code`, else by status."""
    if code is not None and code in _BY_CODE:
        return _BY_CODE[code]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return ServerError if status >= 500 else EvoraHTTPError


def error_from_response(
    status: int, raw: bytes, *, reason: str | None = None, attempts: int = 1
) -> EvoraHTTPError:
    """Build the typed exception for an error answer.

    Bodies that are not problem+json (a proxy's HTML page, an empty 503) still give a useful
    exception: the code falls back to the class's own code or `http_<status>`."""
    body: Any
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        body = None
    problem: dict[str, Any] = body if isinstance(body, dict) else {}
    code = problem.get("code") if isinstance(problem.get("code"), str) else None
    cls = error_class(status, code)
    title = problem.get("title")
    detail = problem.get("detail")
    errors = problem.get("errors")
    problem_type = problem.get("type")
    if detail is None and not problem and raw:
        detail = raw[:200].decode("utf-8", "replace").strip() or None
    return cls(
        status,
        code=code or cls.problem_code or f"http_{status}",
        title=title if isinstance(title, str) else (reason or f"HTTP {status}"),
        detail=detail if isinstance(detail, str) else None,
        type=problem_type if isinstance(problem_type, str) else "about:blank",
        errors=[e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else None,
        body=body,
        attempts=attempts,
    )


class NonRetryable(Exception):
    """Raise from a handler to fail the job without retrying it: it goes to the DLQ at once.

    Any exception with a false `retryable` attribute has the same effect, so existing
    exception classes can opt in without inheriting from this one."""

    retryable: ClassVar[bool] = False


class Snooze(Exception):
    """Raise from a handler to run the job again in `seconds` (more than 0, at most 30 days)
    without using up an attempt: the worker snoozes it (`POST /v1/jobs/{id}/snooze`,
    docs/jobs-that-wait.md). For polling something external without burning retries; the
    job's `snoozes` counts the times. If a cancel was requested, the job is cancelled
    instead."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"snooze for {seconds} s")
        self.seconds = seconds


class RetryAfter(Exception):
    """Raise from a handler when an upstream answered with a rate limit (an HTTP 429 and
    its `Retry-After`, say): the worker fails the attempt with `retry_after` (docs/flow-
    control.md, "Upstream retry-after"). The bucket of `limit_key` is drained for `seconds`
    (more than 0, at most a day) for every dispatcher and worker, so no job holding the key
    starts before then, and this job runs again then without using up an attempt. The key
    should be one a limit governs (a concurrency or a rate): for any other key only the job
    waits. If a cancel was requested, the job is cancelled instead."""

    def __init__(self, seconds: float, *, limit_key: str) -> None:
        super().__init__(f"{limit_key}: retry after {seconds} s")
        self.seconds = seconds
        self.limit_key = limit_key


class JobCancelled(Exception):
    """Raised by `Job.raise_if_cancel_requested()`.

    A handler that ends with an exception after cancellation was requested has its job
    released, which the dispatcher turns into CANCELLED (docs/architecture.md#the-state-machine)."""
