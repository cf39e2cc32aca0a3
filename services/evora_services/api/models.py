"""The query of the job list and its opaque cursor; the bodies and answers of the API's
endpoints are the wire models of evora.protocol.jobs."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

from pydantic import BeforeValidator, ConfigDict, Field, WithJsonSchema

from evora.protocol.bounds import MAX_PAGE
from evora.protocol.fields import LazyModel, QueueName, TypeName
from evora.protocol.states import JobState

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


class JobListQuery(LazyModel):
    # Query values arrive as strings, so this model is lax (limit "20" is 20); unknown
    # parameters are refused so that a misspelt filter is not silently ignored.
    model_config = ConfigDict(extra="forbid")

    queue: QueueName | None = None
    state: JobState | None = None
    type: TypeName | None = None
    limit: int = Field(default=50, ge=1, le=MAX_PAGE)
    after: Cursor | None = None


class PageQuery(LazyModel):
    """A page of a list without filters (pass `next` as `after`)."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=MAX_PAGE)
    after: Cursor | None = None
