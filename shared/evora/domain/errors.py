"""Typed domain errors. Each carries the stable problem `code` (docs/http-api.md#errors) and the
HTTP status the services answer with, so the mapping lives here and nowhere else."""

from __future__ import annotations

from typing import ClassVar

from evora.protocol import problems


class EvoraError(Exception):
    """Something went wrong in Evora."""

    code: ClassVar[str] = "error"
    status: ClassVar[int] = 500
    title: ClassVar[str] = "Internal error"

    def __init__(self, detail: str | None = None) -> None:
        self.detail = detail or (self.__doc__ or self.title).strip()
        super().__init__(self.detail)

    @property
    def headers(self) -> dict[str, str]:
        """Headers the answer carries besides the problem itself."""
        return {}


class JobNotFound(EvoraError):
    """No job with that id."""

    code = problems.JOB_NOT_FOUND
    status = 404
    title = "Job not found"


class LeaseLost(EvoraError):
    """The lease token is not the job's current lease (it expired, or the job moved on)."""

    code = problems.LEASE_LOST
    status = 409
    title = "Lease lost"


class CheckpointsFull(EvoraError):
    """A checkpoint that would take its job over MAX_CHECKPOINTS names or
    MAX_CHECKPOINT_BYTES in all (evora.protocol.bounds); nothing was stored."""

    code = problems.PAYLOAD_TOO_LARGE
    status = 413
    title = "Checkpoints too large"


class InvalidState(EvoraError):
    """The job is not in a state that allows this operation."""

    code = problems.INVALID_STATE
    status = 409
    title = "Invalid state"


class CallbackNotFound(EvoraError):
    """No callback with that id (or its job was pruned)."""

    code = problems.CALLBACK_NOT_FOUND
    status = 404
    title = "Callback not found"


class CallbackSettled(EvoraError):
    """The callback can no longer be resolved: it timed out, or its job was cancelled."""

    code = problems.CALLBACK_SETTLED
    status = 409
    title = "Callback settled"


class IdempotencyConflict(EvoraError):
    """The idempotency key was already used for this queue with different submission fields."""

    code = problems.IDEMPOTENCY_CONFLICT
    status = 409
    title = "Idempotency conflict"


class IdempotentJobGone(EvoraError):
    """The idempotency key was used, but its job has since been removed by retention."""

    code = problems.IDEMPOTENT_JOB_GONE
    status = 409
    title = "Idempotent job gone"


class InvalidDependency(EvoraError):
    """A dependency names no job, or a job whose failure would cancel this one at once."""

    code = problems.VALIDATION_ERROR
    status = 422
    title = "Invalid dependency"


class QueueNotFound(EvoraError):
    """No queue by that name has been seen."""

    code = problems.QUEUE_NOT_FOUND
    status = 404
    title = "Queue not found"


class ScheduleNotFound(EvoraError):
    """No schedule by that name."""

    code = problems.SCHEDULE_NOT_FOUND
    status = 404
    title = "Schedule not found"


class LimitNotFound(EvoraError):
    """No limit governs that key (neither its own nor a prefix limit)."""

    code = problems.LIMIT_NOT_FOUND
    status = 404
    title = "Limit not found"


# Seconds a producer refused with queue_full is asked to wait (`Retry-After`): a constant, not
# an estimate (docs/flow-control.md, "Admission").
QUEUE_FULL_RETRY_SECONDS = 1


class QueueFull(EvoraError):
    """A key the submission holds has as many jobs waiting to run as its max_pending allows."""

    code = problems.QUEUE_FULL
    status = 429
    title = "Queue full"

    def __init__(self, detail: str, *, key: str, queue: str) -> None:
        super().__init__(detail)
        self.key = key
        self.queue = queue  # the queue of a refused job holding the key (a metric's label)

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(QUEUE_FULL_RETRY_SECONDS)}
