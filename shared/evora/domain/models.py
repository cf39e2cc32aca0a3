"""Validated shapes of what clients send (docs/http-api.md#submitting-a-job) and what the
store returns.

Validation happens once, at the edge, with these models; the store trusts them.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from uuid import UUID

import orjson
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from evora.protocol.limits import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    KEY_MAX_LENGTH,
    MAX_SECONDS,
    QUEUE_PATTERN,
    TYPE_PATTERN,
)
from evora.protocol.problems import PAYLOAD_TOO_LARGE
from evora.protocol.states import JobState

QueueName = Annotated[str, Field(pattern=QUEUE_PATTERN)]
TypeName = Annotated[str, Field(pattern=TYPE_PATTERN)]
# PostgreSQL text cannot hold U+0000.
Key = Annotated[str, Field(min_length=1, max_length=KEY_MAX_LENGTH, pattern=r"^[^\x00]*$")]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class Backoff(_Strict):
    # JSON Schema cannot compare two fields, so /openapi.json says this rule in words.
    model_config = ConfigDict(
        json_schema_extra={
            "description": "max_seconds must be >= initial_seconds (a field left out counts "
            "with its default), else 422."
        }
    )

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


# The escape of a NUL character in encoded JSON (not the text `\u0000`, whose backslash is
# itself escaped).
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def check_encoded_size(value: Any, limit: int, what: str) -> Any:
    """Client JSON (payloads, results, progress) is bounded by its encoded size, and must be
    something PostgreSQL's jsonb can store."""
    try:
        encoded = orjson.dumps(value)
    except orjson.JSONEncodeError as exc:  # e.g. an integer beyond 64 bits
        raise ValueError(f"{what} cannot be stored: {exc}") from None
    size = len(encoded)
    if size > limit:
        raise PydanticCustomError(
            PAYLOAD_TOO_LARGE,
            "{what} is {size} bytes encoded; the limit is {limit}",
            {"what": what, "size": size, "limit": limit},
        )
    if b"\\u0000" in encoded and _NUL_ESCAPE.search(encoded):
        raise ValueError(f"{what} contains U+0000, which PostgreSQL cannot store in JSON")
    return value


# asyncpg writes the first and the last instant a datetime can hold as PostgreSQL's
# -infinity and infinity, and reads those back as naive datetimes: neither round-trips.
_INFINITY_STAND_INS = (datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC))


def _storable_in_utc(value: datetime) -> datetime:
    # Timestamps are stored in UTC; an offset that pushes one past year 1 or 9999 there
    # cannot be stored (nor read back).
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        raise ValueError("is out of range once converted to UTC") from None
    if utc in _INFINITY_STAND_INS:
        raise ValueError("is out of range: the first and last instants cannot be stored")
    return value


Timestamp = Annotated[AwareDatetime, AfterValidator(_storable_in_utc)]


class JobSubmission(_Strict):
    # _one_schedule for /openapi.json: run_at and delay_seconds, both given and not null.
    model_config = ConfigDict(
        json_schema_extra={
            "not": {
                "required": ["run_at", "delay_seconds"],
                "properties": {"run_at": {"type": "string"}, "delay_seconds": {"type": "number"}},
            }
        }
    )

    queue: QueueName
    type: TypeName
    payload: Any = Field(default_factory=dict)
    priority: int = Field(default=0, ge=-32768, le=32767)
    run_at: Timestamp | None = None
    delay_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    max_attempts: int = Field(default=5, ge=1, le=1000)
    lease_seconds: int = Field(default=30, ge=1, le=86400)
    backoff: Backoff = Field(default_factory=Backoff)
    expires_at: Timestamp | None = None
    idempotency_key: Key | None = None
    group_key: Key | None = None

    @field_validator("payload")
    @classmethod
    def _payload_fits(cls, value: Any, info: ValidationInfo) -> Any:
        return check_encoded_size(value, encoded_size_limit(info), "payload")

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
    traceback: str | None = None


class Job(BaseModel):
    """A job as the API returns it (docs/http-api.md#the-job-resource)."""

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
    """One row of the `job_events` outbox (docs/http-api.md#the-event-resource)."""

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
