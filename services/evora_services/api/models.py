"""The query of the job list and its opaque cursor; the bodies and answers of the API's
endpoints are the wire models of evora.protocol.jobs."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated
from uuid import UUID

from pydantic import BeforeValidator, ConfigDict, Field, WithJsonSchema

from evora.protocol.bounds import MAX_PAGE
from evora.protocol.fields import LazyModel, QueueName, TypeName
from evora.protocol.states import JobState

_SEQ_BYTES = 8  # a submit_seq is a PostgreSQL bigint
_ID_BYTES = 16  # a job's id


def encode_cursor(position: int | UUID) -> str:
    """The opaque `next` cursor of a list: where the following page starts (a job's id for
    the job list, a submit_seq for a job's dependents)."""
    if isinstance(position, UUID):
        raw = position.bytes
    else:
        raw = position.to_bytes(_SEQ_BYTES, "big", signed=True)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _position(value: str, sizes: tuple[int, ...]) -> int | UUID:
    """A cursor back to what it encodes, if it encodes one of `sizes` bytes. Only the exact
    strings `encode_cursor` makes are accepted, so a cursor is either one we issued or a 422,
    never a silent misread."""
    try:
        raw = base64.b64decode(value + "=" * (-len(value) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not a cursor returned by this API") from None
    if len(raw) not in sizes:
        raise ValueError("not a cursor returned by this API")
    position: int | UUID = (
        UUID(bytes=raw) if len(raw) == _ID_BYTES else int.from_bytes(raw, "big", signed=True)
    )
    if encode_cursor(position) != value:
        raise ValueError("not a cursor returned by this API")
    return position


def decode_cursor(value: object) -> object:
    """A cursor of a job's dependents back to its submit_seq."""
    if value is None or not isinstance(value, str):
        return value
    return _position(value, (_SEQ_BYTES,))


def decode_job_cursor(value: object) -> object:
    """A cursor of the job list back to the id of the last job listed; or, from a cursor the
    release before made (it paged by submission number, migration 0068), to that submit_seq,
    which the store reads as the id it stands for: a client paging across a rolling upgrade
    goes on where it was."""
    if value is None or not isinstance(value, str):
        return value
    return _position(value, (_ID_BYTES, _SEQ_BYTES))


# an encoded bigint: 8 bytes, unpadded base64url, whose last character carries 4 bits and
# two zero bits (so every string of this pattern is a cursor)
_SEQ_PATTERN = "[A-Za-z0-9_-]{10}[AEIMQUYcgkosw048]"
# an encoded id: 16 bytes, whose last character carries 2 bits and four zero bits
_ID_PATTERN = "[A-Za-z0-9_-]{21}[AQgw]"
_CURSOR_DESCRIPTION = "the `next` value of the previous page; anything else is a 422"

Cursor = Annotated[
    int,
    BeforeValidator(decode_cursor),
    WithJsonSchema(
        {"type": "string", "pattern": f"^{_SEQ_PATTERN}$", "description": _CURSOR_DESCRIPTION}
    ),
]

JobCursor = Annotated[
    UUID | int,
    BeforeValidator(decode_job_cursor),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": f"^({_ID_PATTERN}|{_SEQ_PATTERN})$",
            "description": _CURSOR_DESCRIPTION,
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
    after: JobCursor | None = None


class PageQuery(LazyModel):
    """A page of a list without filters (pass `next` as `after`)."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=MAX_PAGE)
    after: Cursor | None = None
