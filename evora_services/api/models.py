"""What the API's endpoints take and answer, as pydantic models.

Request models validate at the edge (rule 10 of docs/architecture.md). Response models are
not used to serialise (the store's dicts go straight to orjson); they describe the answers in
/openapi.json, and the tests check real answers against them.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from evora.domain.models import Backoff, Job, JobEvent, JobSubmission, QueueName, TypeName
from evora.protocol.limits import MAX_BATCH, MAX_PAGE
from evora.protocol.states import JobState

MAX_REDRIVE = 1_000_000

_CURSOR_BYTES = 8  # a submit_seq is a PostgreSQL bigint


def encode_cursor(submit_seq: int) -> str:
    """The opaque `next` cursor of a job list: where the following page starts."""
    raw = submit_seq.to_bytes(_CURSOR_BYTES, "big", signed=True)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(value: object) -> object:
    """A cursor back to its submit_seq. Only the exact strings `encode_cursor` makes are
    accepted, so a cursor is either one we issued or a 422, never a silent misread."""
    if value is None or not isinstance(value, str):
        return value
    try:
        raw = base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not a cursor returned by this API") from None
    if len(raw) != _CURSOR_BYTES:
        raise ValueError("not a cursor returned by this API")
    seq = int.from_bytes(raw, "big", signed=True)
    if encode_cursor(seq) != value:
        raise ValueError("not a cursor returned by this API")
    return seq


Cursor = Annotated[
    int,
    BeforeValidator(decode_cursor),
    WithJsonSchema(
        {
            "type": "string",
            # an encoded bigint: 8 bytes, unpadded base64url, whose last character carries
            # 4 bits and two zero bits (so every string of this pattern is a cursor)
            "pattern": "^[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]$",
            "description": "the `next` value of the previous page; anything else is a 422",
        }
    ),
]


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


# -- requests ------------------------------------------------------------------------------


class BatchSubmission(_Body):
    jobs: list[JobSubmission] = Field(min_length=1, max_length=MAX_BATCH)


class RedriveRequest(_Body):
    type: TypeName | None = Field(default=None, description="only DLQ jobs of this type")
    limit: int | None = Field(
        default=None, ge=1, le=MAX_REDRIVE, description="move at most this many jobs"
    )


class JobListQuery(BaseModel):
    # Query values arrive as strings, so this model is lax (limit "20" is 20); unknown
    # parameters are refused so that a misspelt filter is not silently ignored.
    model_config = ConfigDict(extra="forbid")

    queue: QueueName | None = None
    state: JobState | None = None
    type: TypeName | None = None
    limit: int = Field(default=50, ge=1, le=MAX_PAGE)
    after: Cursor | None = None


# -- responses -----------------------------------------------------------------------------


class JobResponse(Job):
    """The job resource, with the extra fields the API also returns."""

    backoff: Backoff
    progress: Any = Field(default=None, description="the last progress a worker reported")


class BatchItem(BaseModel):
    status: Literal[200, 201] = Field(description="201 created, 200 idempotent replay")
    job: JobResponse


class BatchResult(BaseModel):
    jobs: list[BatchItem]


class JobList(BaseModel):
    jobs: list[JobResponse]
    next: str | None = Field(description="pass as `after` for the next page; null at the end")


class Events(BaseModel):
    events: list[JobEvent]


class Redriven(BaseModel):
    redriven: int


class QueuePauseState(BaseModel):
    queue: str
    paused: bool
