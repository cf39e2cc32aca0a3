"""Evora, a distributed job queue on PostgreSQL.

`import evora` gives the public SDK (README.md): `evora.Client` for producers and
admins, `evora.Worker` and `evora.Handlers` for worker processes, and the exceptions they
raise. Services and tooling live in the subpackages.

The SDK is imported on first use of one of its names (PEP 562), not by `import evora`: every
`evora.*` module runs this file first, and the SDK brings aiohttp's client (and with it ssl),
about half a second of CPU that `evora --version`, `evora migrate` or a service that never
calls the SDK would otherwise pay at each start. Type checkers and IDEs read the star import
below, which only they run.
"""

# ruff: noqa: F405  (__all__ names what the star import below gives type checkers)

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evora.sdk import *  # noqa: F403  (the SDK's public names are the package's)

# The SDK's `__all__`, written out because reading it would import the SDK;
# tests/unit/test_lazy_imports.py fails when the two differ.
__all__ = [
    "BadRequestError",
    "CallbackNotFoundError",
    "CallbackSettledError",
    "Client",
    "ConflictError",
    "DebounceSpec",
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
    "QueueFullError",
    "QueueNotFoundError",
    "RequestValidationError",
    "RetryAfter",
    "RetryBackoff",
    "ScheduleNotFoundError",
    "ServerError",
    "Snooze",
    "Submission",
    "SubmitOptions",
    "SubmitReceipt",
    "SubmitResult",
    "ThrottleSpec",
    "UnauthorizedError",
    "Worker",
    "WorkerSettings",
    "run_worker_from_module",
]
_SDK_NAMES = frozenset(__all__)


def __getattr__(name: str) -> Any:
    # Only the SDK's names: any other must raise AttributeError, which is how
    # `from evora import loops` learns to import the submodule instead.
    if name not in _SDK_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from evora import sdk

    value = getattr(sdk, name)
    globals()[name] = value  # the next lookup is an ordinary one
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
