"""The building blocks of the wire models: the strict base every request body uses, the
names and keys a request may carry, and the size rule for client JSON."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any

import orjson
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
)
from pydantic_core import PydanticCustomError

from evora.protocol.limits import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    KEY_MAX_LENGTH,
    QUEUE_PATTERN,
    TYPE_PATTERN,
)
from evora.protocol.problems import PAYLOAD_TOO_LARGE


class WireModel(BaseModel):
    """A request body: JSON types as sent (no coercion of "1" to 1), no unknown fields, no
    NaN or infinities."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


QueueName = Annotated[str, Field(pattern=QUEUE_PATTERN)]
TypeName = Annotated[str, Field(pattern=TYPE_PATTERN)]
# PostgreSQL text cannot hold U+0000.
Key = Annotated[str, Field(min_length=1, max_length=KEY_MAX_LENGTH, pattern=r"^[^\x00]*$")]
WorkerId = Key


# The escape of a NUL character in encoded JSON (not the text `\u0000`, whose backslash is
# itself escaped).
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


# A validation context key: the caller checks the client JSON of the whole body at once
# with `all_fit` afterwards, and validates again without this key when that check fails,
# so that its errors are exactly those of the check made value by value.
CHECKED_TOGETHER = "client_json_checked_together"


def _holds_nul(encoded: bytes) -> bool:
    return b"\\u0000" in encoded and _NUL_ESCAPE.search(encoded) is not None


def _fits(value: Any, info: ValidationInfo, what: str) -> Any:
    """Client JSON (payloads, results, progress) is bounded by its encoded size, and must be
    something PostgreSQL's jsonb can store. The limit is the service's
    EVORA_MAX_PAYLOAD_BYTES, passed as `max_payload_bytes` in the validation context."""
    context = info.context if isinstance(info.context, dict) else {}
    if context.get(CHECKED_TOGETHER):
        return value
    encode_client_json(
        value, what, int(context.get("max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES))
    )
    return value


def encode_client_json(value: Any, what: str, limit: int) -> bytes:
    """`value` encoded, if it is client JSON that fits `limit` bytes and that jsonb can store;
    else the validation error `_fits` reports. For callers that check many values in one
    pass instead of one validator call each, and keep the encoding."""
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
    if _holds_nul(encoded):
        raise ValueError(f"{what} contains U+0000, which PostgreSQL cannot store in JSON")
    return encoded


def all_fit(values: Sequence[Any], limit: int) -> bool:
    """Whether every value surely passes `_fits`, found with one encoding of them all (a
    thousand payloads of a batch: one call instead of a thousand), and only when together
    they exceed `limit` with one encoding each (a batch of payloads of a few kilobytes is
    over a limit of one megabyte together, and must not be validated twice for it). False
    says only "check them one by one"."""
    try:
        encoded = orjson.dumps(values)
    except orjson.JSONEncodeError:
        return False
    if _holds_nul(encoded):
        return False
    return len(encoded) <= limit or all(len(orjson.dumps(value)) <= limit for value in values)


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


def _client_json(what: str) -> AfterValidator:
    def check(value: Any, info: ValidationInfo) -> Any:
        return _fits(value, info, what)

    return AfterValidator(check)


# Client JSON values, each bounded and checked by `_fits` under its own name.
Payload = Annotated[Any, _client_json("payload")]
Result = Annotated[Any, _client_json("result")]
Progress = Annotated[Any, _client_json("progress")]
