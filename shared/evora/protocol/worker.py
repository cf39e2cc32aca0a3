"""What a worker sends to the dispatcher and what it answers (docs/http-api.md#worker-api)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import ConfigDict, Field, field_validator, model_validator

from evora.protocol.bounds import (
    CHECKPOINT_NAME_PATTERN,
    MAX_ACKS,
    MAX_CALLBACK_TIMEOUT_SECONDS,
    MAX_CHILDREN,
    MAX_CLAIM_JOBS,
    MAX_CLAIM_QUEUES,
    MAX_ERROR_MESSAGE,
    MAX_ERROR_TRACEBACK,
    MAX_RETRY_AFTER_SECONDS,
    MAX_SECONDS,
    MAX_SNOOZE_SECONDS,
    MAX_WAIT_SECONDS,
)
from evora.protocol.fields import (
    CheckpointData,
    LazyModel,
    Progress,
    QueueName,
    Result,
    TypeName,
    WireModel,
    WorkerId,
)
from evora.protocol.jobs import ClaimedJob, Job, JobSubmission, LimitKey


class HeartbeatRequest(WireModel):
    lease_token: UUID
    lease_seconds: int | None = Field(default=None, ge=1, le=86400)
    progress: Progress = None


class HeartbeatResponse(LazyModel):
    lease_expires_at: datetime
    cancel_requested: bool
    timeout_requested: bool = Field(
        description="the attempt ran past the job's max_duration_seconds: stop the handler and "
        "fail the attempt (error type `timeout`); after a grace of lease_seconds the sweeper "
        "fails it (docs/jobs-that-wait.md)"
    )


class CompleteRequest(WireModel):
    lease_token: UUID
    result: Result = None


class ErrorBody(WireModel):
    message: str
    type: str | None = Field(default=None, max_length=255)
    retryable: bool = True
    traceback: str | None = Field(default=None, description="the stack trace, as text")

    @field_validator("message", "type")
    @classmethod
    def _storable(cls, value: str | None) -> str | None:
        # A failing worker's report is never refused for its text: NUL (which PostgreSQL
        # cannot store) is replaced and an endless trace is cut.
        return None if value is None else value.replace("\x00", "\ufffd")[:MAX_ERROR_MESSAGE]

    @field_validator("traceback")
    @classmethod
    def _trace_storable(cls, value: str | None) -> str | None:
        # likewise, keeping the end of a trace: the innermost frames and the exception
        return None if value is None else value.replace("\x00", "\ufffd")[-MAX_ERROR_TRACEBACK:]


class RetryAfter(WireModel):
    """An upstream's rate-limit answer (docs/flow-control.md, "Upstream retry-after"): the
    bucket of `limit_key` is drained for `seconds`, for every dispatcher and worker, and the
    job runs again then without using up an attempt."""

    limit_key: LimitKey
    seconds: float = Field(
        gt=0, le=MAX_RETRY_AFTER_SECONDS, description="the upstream's retry-after, in seconds"
    )


def _retry_after_alone(
    error: ErrorBody | None, retry_in_seconds: float | None, retry_after: RetryAfter | None
) -> None:
    """A retry-after is the retry's delay, and is retried: evora.fail() refuses the same."""
    if retry_after is None:
        return
    if retry_in_seconds is not None:
        raise ValueError("give retry_in_seconds or retry_after, not both")
    if error is not None and not error.retryable:
        raise ValueError("retry_after: a failure that is not retryable is not retried")


class FailRequest(WireModel):
    lease_token: UUID
    error: ErrorBody
    retry_in_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    retry_after: RetryAfter | None = None

    @model_validator(mode="after")
    def _retry_after_alone(self) -> FailRequest:
        _retry_after_alone(self.error, self.retry_in_seconds, self.retry_after)
        return self


class ReleaseRequest(WireModel):
    lease_token: UUID
    delay_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)


class SnoozeRequest(WireModel):
    lease_token: UUID
    delay_seconds: float = Field(
        gt=0, le=MAX_SNOOZE_SECONDS, description="run again this many seconds from now"
    )


class CheckpointRequest(WireModel):
    lease_token: UUID
    name: str = Field(pattern=CHECKPOINT_NAME_PATTERN, description="the step it records")
    data: CheckpointData = Field(
        default=None, description="what the step produced; replaces an earlier one of the name"
    )


class CheckpointResponse(LazyModel):
    checkpoints: dict[str, Any] = Field(description="every checkpoint of the job, name -> data")


class SuspendRequest(WireModel):
    lease_token: UUID
    timeout_seconds: float = Field(
        gt=0,
        le=MAX_CALLBACK_TIMEOUT_SECONDS,
        description="how long the job waits for the callback's resolution",
    )
    on_timeout: Literal["fail", "dlq", "resume"] = Field(
        default="fail",
        description=(
            "then: `fail` the attempt (retried by the job's backoff, or DLQ with none left), "
            "`dlq` at once, or `resume` the job with `callback.timed_out` set"
        ),
    )


class SuspendResponse(LazyModel):
    callback_id: str | None = Field(
        description=(
            "the one-time callback id, the credential that resolves it (POST "
            "/v1/callbacks/{callback_id}); shown this once. Null when a requested cancel won "
            "and the job is CANCELLED"
        )
    )
    job: Job


class ChildrenRequest(WireModel):
    lease_token: UUID
    jobs: list[JobSubmission] = Field(
        min_length=1,
        max_length=MAX_CHILDREN,
        description=(
            "the children, each as an item of POST /v1/jobs/batch (refs, idempotency keys and "
            "all); stored all or nothing with the job's move to WAITING"
        ),
    )
    on_dependency_failure: Literal["cancel", "run"] | None = Field(
        default=None,
        description=(
            "what a cancelled child does to the job (docs/dependencies.md); null keeps the "
            "job's own"
        ),
    )


class Child(LazyModel):
    id: UUID
    status: Literal[200, 201] = Field(
        description="201 created, 200 an idempotency key's job (or a debounce or throttle key's)"
    )


class ChildrenResponse(LazyModel):
    job: Job = Field(
        description=(
            "the job as it now is: WAITING for its children (PENDING if they had all ended, "
            "CANCELLED if a requested cancel won)"
        )
    )
    children: list[Child] = Field(
        description="the children in request order; empty when a requested cancel won"
    )


class Ack(WireModel):
    # _error_with_failure for /openapi.json: a fail ack has an error (an object, not null).
    model_config = ConfigDict(
        json_schema_extra={
            "if": {"required": ["outcome"], "properties": {"outcome": {"const": "fail"}}},
            "then": {"required": ["error"], "properties": {"error": {"type": "object"}}},
        }
    )

    id: UUID
    lease_token: UUID
    outcome: Literal["complete", "fail"]
    result: Result = None
    error: ErrorBody | None = None
    retry_in_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    retry_after: RetryAfter | None = None

    @model_validator(mode="after")
    def _error_with_failure(self) -> Ack:
        if self.outcome == "fail" and self.error is None:
            raise ValueError("a fail ack needs an error")
        _retry_after_alone(self.error, self.retry_in_seconds, self.retry_after)
        return self


class AcksRequest(WireModel):
    acks: list[Ack] = Field(min_length=1, max_length=MAX_ACKS)


class AckResult(LazyModel):
    id: UUID
    status: int


class AcksResponse(LazyModel):
    results: list[AckResult]


class ClaimRequest(WireModel):
    worker_id: WorkerId
    queues: list[QueueName] = Field(min_length=1, max_length=MAX_CLAIM_QUEUES)
    max_jobs: int = Field(default=1, ge=1, le=MAX_CLAIM_JOBS)
    wait_seconds: float = Field(default=20, ge=0, le=MAX_WAIT_SECONDS)
    types: list[TypeName] | None = Field(default=None, min_length=1, max_length=1000)
    acks: list[Ack] | None = Field(
        default=None,
        max_length=MAX_ACKS,
        description="outcomes settled as by POST /v1/acks while the claim runs",
    )


class ClaimResponse(LazyModel):
    jobs: list[ClaimedJob]
    results: list[AckResult] | None = Field(
        default=None, description="one status per item of the request's acks, if it had any"
    )
