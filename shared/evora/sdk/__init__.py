"""The public Python SDK (README.md): `Client` for producers and admins, `Worker`
and `Handlers` for worker processes, and the exceptions both raise."""

from evora.protocol.retries import RetryBackoff
from evora.sdk.client import Client, JobData, JobPage, Submission, SubmitOptions, SubmitResult
from evora.sdk.errors import (
    BadRequestError,
    ConflictError,
    EvoraClientError,
    EvoraConnectionError,
    EvoraHTTPError,
    ForbiddenError,
    IdempotencyConflictError,
    IdempotentJobGoneError,
    InvalidStateError,
    JobCancelled,
    JobNotFoundError,
    LeaseLostError,
    LimitNotFoundError,
    MalformedJSONError,
    NonRetryable,
    NotFoundError,
    PayloadTooLargeError,
    QueueNotFoundError,
    RequestValidationError,
    ScheduleNotFoundError,
    ServerError,
    UnauthorizedError,
)
from evora.sdk.handlers import Handler, Handlers, Job
from evora.sdk.loading import run_worker_from_module
from evora.sdk.settings import WorkerSettings
from evora.sdk.worker import Worker

__all__ = [
    "BadRequestError",
    "Client",
    "ConflictError",
    "EvoraClientError",
    "EvoraConnectionError",
    "EvoraHTTPError",
    "ForbiddenError",
    "Handler",
    "Handlers",
    "IdempotencyConflictError",
    "IdempotentJobGoneError",
    "InvalidStateError",
    "Job",
    "JobCancelled",
    "JobData",
    "JobNotFoundError",
    "JobPage",
    "LeaseLostError",
    "LimitNotFoundError",
    "MalformedJSONError",
    "NonRetryable",
    "NotFoundError",
    "PayloadTooLargeError",
    "QueueNotFoundError",
    "RequestValidationError",
    "RetryBackoff",
    "ScheduleNotFoundError",
    "ServerError",
    "Submission",
    "SubmitOptions",
    "SubmitResult",
    "UnauthorizedError",
    "Worker",
    "WorkerSettings",
    "run_worker_from_module",
]
