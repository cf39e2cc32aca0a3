"""Validated shapes of what clients send (CONTRACT section 3) and what the store returns.

Validation happens once, at the edge, with these models; the store trusts them.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Annotated, Any
from uuid import UUID

import orjson
from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from evora.domain.states import JobState

QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
TYPE_PATTERN = r"^[A-Za-z0-9_.:-]{1,255}$"

# Intervals beyond this overflow nothing in PostgreSQL, but no sane schedule needs them;
# bounding them keeps every computed timestamp representable.
MAX_SECONDS = 10 * 365 * 24 * 3600

QueueName = Annotated[str, Field(pattern=QUEUE_PATTERN)]
TypeName = Annotated[str, Field(pattern=TYPE_PATTERN)]
Key = Annotated[str, Field(min_length=1, max_length=255)]

DEFAULT_MAX_PAYLOAD_BYTES = 1_048_576


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class Backoff(_Strict):
    initial_seconds: float = Field(default=1.0, gt=0, le=MAX_SECONDS)
    max_seconds: float = Field(default=3600.0, gt=0, le=MAX_SECONDS)
    multiplier: float = Field(default=2.0, ge=1, le=1000)

    @model_validator(mode="after")
    def _max_not_below_initial(self) -> Backoff:
        if self.max_seconds < self.initial_seconds:
            raise ValueError("max_seconds must be >= initial_seconds")
        return self


def encoded_size_limit(info: ValidationInfo) -> int:
    context = info.context if isinstance(info.context, dict) else {}
    limit = context.get("max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES)
    return int(limit)


class JobSubmission(_Strict):
    queue: QueueName
    type: TypeName
    payload: Any = Field(default_factory=dict)
    priority: int = Field(default=0, ge=-32768, le=32767)
    run_at: AwareDatetime | None = None
    delay_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    max_attempts: int = Field(default=5, ge=1, le=1000)
    lease_seconds: int = Field(default=30, ge=1, le=86400)
    backoff: Backoff = Field(default_factory=Backoff)
    expires_at: AwareDatetime | None = None
    idempotency_key: Key | None = None
    group_key: Key | None = None

    @field_validator("payload")
    @classmethod
    def _payload_fits(cls, value: Any, info: ValidationInfo) -> Any:
        limit = encoded_size_limit(info)
        size = len(orjson.dumps(value))
        if size > limit:
            raise ValueError(f"payload is {size} bytes encoded; the limit is {limit}")
        return value

    @model_validator(mode="after")
    def _one_schedule(self) -> JobSubmission:
        if self.run_at is not None and self.delay_seconds is not None:
            raise ValueError("give run_at or delay_seconds, not both")
        return self

    def scheduled_for(self, now: datetime) -> datetime:
        if self.run_at is not None:
            return self.run_at
        return now + timedelta(seconds=self.delay_seconds or 0.0)

    def fingerprint(self) -> bytes:
        """Identity of the submission for idempotency: the fields as given, defaults filled.

        `delay_seconds` is kept as given (not resolved to a time) so that retrying the same
        request later still matches."""
        fields = self.model_dump(mode="json", exclude={"idempotency_key"})
        return hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)).digest()


class LastError(BaseModel):
    message: str
    type: str | None = None


class Job(BaseModel):
    """A job as the API returns it (CONTRACT section 3)."""

    id: UUID
    queue: str
    type: str
    payload: Any
    state: JobState
    priority: int
    group_key: str | None
    idempotency_key: str | None
    attempt: int
    max_attempts: int
    lease_seconds: int
    run_at: datetime
    expires_at: datetime | None
    lease_expires_at: datetime | None
    worker_id: str | None
    cancel_requested: bool
    result: Any
    last_error: LastError | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class ClaimedJob(Job):
    lease_token: UUID


class JobEvent(BaseModel):
    """One row of the `job_events` outbox (CONTRACT section 7)."""

    seq: int
    job_id: UUID
    queue: str
    type: str
    event: str
    from_state: JobState | None
    to_state: JobState
    attempt: int
    worker_id: str | None
    at: datetime
    data: dict[str, Any]
