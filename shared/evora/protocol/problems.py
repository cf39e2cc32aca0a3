"""The stable machine-readable `code` of every problem (RFC 9457) the services answer with;
the SDK raises one exception class per code."""

from __future__ import annotations

from typing import Final

MALFORMED_JSON: Final = "malformed_json"
VALIDATION_ERROR: Final = "validation_error"
PAYLOAD_TOO_LARGE: Final = "payload_too_large"
UNAUTHORIZED: Final = "unauthorized"
FORBIDDEN: Final = "forbidden"
JOB_NOT_FOUND: Final = "job_not_found"
QUEUE_NOT_FOUND: Final = "queue_not_found"
SCHEDULE_NOT_FOUND: Final = "schedule_not_found"
LIMIT_NOT_FOUND: Final = "limit_not_found"
CALLBACK_NOT_FOUND: Final = "callback_not_found"
LEASE_LOST: Final = "lease_lost"
INVALID_STATE: Final = "invalid_state"
CALLBACK_SETTLED: Final = "callback_settled"
IDEMPOTENCY_CONFLICT: Final = "idempotency_conflict"
IDEMPOTENT_JOB_GONE: Final = "idempotent_job_gone"
QUEUE_FULL: Final = "queue_full"
UNAVAILABLE: Final = "unavailable"
INTERNAL_ERROR: Final = "internal_error"
INVALID_HEADER: Final = "invalid_header"
