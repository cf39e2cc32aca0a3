"""The building blocks of the wire models: the strict base every request body uses, the
names and keys a request may carry, and the size rule for client JSON."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any

import orjson
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
)
from pydantic_core import PydanticCustomError

from evora.protocol.bounds import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    KEY_MAX_LENGTH,
    QUEUE_PATTERN,
    TYPE_PATTERN,
)
from evora.protocol.problems import PAYLOAD_TOO_LARGE


class LazyModel(BaseModel):
    """A model whose validator and serializer are built when it is first used, not when its
    module is imported: a service process imports many models it never uses (the sweeper all
    of the protocol's), and building them was a tenth of its start-up CPU."""

    model_config = ConfigDict(defer_build=True)


class WireModel(LazyModel):
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
    except orjson.JSONEncodeError:
        # An integer beyond 64 bits: jsonb keeps it exactly, and so does the body's exact
        # parse (`exact_json`) that replaces this value before it is stored.
        try:
            encoded = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
        except (TypeError, ValueError) as exc:
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
    except orjson.JSONEncodeError:  # an integer beyond 64 bits: `_fits` judges it
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

# The fraction of a second in RFC 3339 text, when it has more digits than microseconds.
_SUB_MICROSECOND = re.compile(r"(?<=:\d\d)[.,](\d{7,})")


def rounded_like_postgresql(parsed: datetime, text: str) -> datetime:
    """`parsed` from `text`, rounded to microseconds as PostgreSQL rounds `text` when it has
    more than six digits of fraction (`rint(strtod(fraction) * 1e6)`, in doubles: ties to
    even); the model's parser truncates them. OverflowError past the last instant."""
    fraction = _SUB_MICROSECOND.search(text)
    if fraction is None:
        return parsed
    digits = fraction[1]
    rounded = round(float("0." + digits) * 1_000_000)
    return parsed + timedelta(microseconds=rounded - int(digits[:6]))


def _whole(value: Any) -> Any:
    # A whole number written as 1e2 or 100.0 arrives as a float; jsonb (and so evora.submit)
    # reads it as the integer it is. Anything else is for the strict int to judge.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# An integer field: any JSON number whose value is whole (100, 1e2, 100.0), as in SQL.
WholeNumber = Annotated[int, BeforeValidator(_whole)]


def _client_json(what: str) -> AfterValidator:
    def check(value: Any, info: ValidationInfo) -> Any:
        return _fits(value, info, what)

    return AfterValidator(check)


class _ClientJSON:
    """Marks a field of client JSON: `with_exact_values` puts the client's own numbers in."""


CLIENT_JSON = _ClientJSON()

# Client JSON values, each bounded and checked by `_fits` under its own name.
Payload = Annotated[Any, _client_json("payload"), CLIENT_JSON]
Result = Annotated[Any, _client_json("result"), CLIENT_JSON]
Progress = Annotated[Any, _client_json("progress"), CLIENT_JSON]
CheckpointData = Annotated[Any, _client_json("data"), CLIENT_JSON]

# The range of integers orjson (and so the codecs) writes as they are.
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


def _exact_int(text: str) -> Any:
    number = int(text)
    if _INT64_MIN <= number <= _UINT64_MAX:
        return number
    return orjson.Fragment(text.encode())


def _exact_number(text: str) -> orjson.Fragment:
    return orjson.Fragment(text.encode())


# Digits as 0 and E as e, so that what any number contains is a plain substring:
# `bytes.translate` and `in` search JSON text at about a nanosecond a byte, where `re` has to
# try a pattern at every position.
DIGITS_AS_ZERO = bytes.maketrans(b"0123456789E", b"0000000000e")

# A JSON string, escapes included. Possessive quantifiers: linear time whatever the input.
_STRING = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"')


def json_skeleton(raw: bytes | bytearray) -> bytes:
    """JSON text with every string emptied: what is left is structure, numbers and
    literals, so a match there is never text inside a string."""
    pieces = raw.split(b'"')
    if b"\\" not in raw and len(pieces) % 2:
        # No escapes and balanced quotes: the strings are exactly the odd pieces between
        # quotes. Splitting runs in C at a nanosecond or two a byte, where the pattern costs
        # tens: ack bodies (full of ids) take this path on every claim.
        return b'""'.join(pieces[::2])
    return _STRING.sub(b'""', raw)


def exact_json(raw: bytes | bytearray) -> Any:
    """JSON text parsed with every number as the client wrote it: a number with a fraction
    or an exponent, and an integer beyond 64 bits, becomes an orjson.Fragment of its text,
    which orjson (and so every codec) writes back unchanged and jsonb reads exactly. (A
    float would round 12345678901234567.89 and write 1e2 as 100.0.)"""
    return json.loads(raw, parse_float=_exact_number, parse_int=_exact_int)


def _float_unless_rounded(text: str) -> float | orjson.Fragment:
    """A stored number as a float when the float is exactly that number written shortest
    (as PostgreSQL writes a double, so Evora's own figures stay numbers to compute with),
    else as its text: a client's 12345678901234567.89 is not 12345678901234568."""
    number = float(text)
    if math.isfinite(number) and Decimal(repr(number)) == Decimal(text):
        return number
    return orjson.Fragment(text.encode())


def stored_json(raw: bytes | bytearray) -> Any:
    """JSON text PostgreSQL wrote (jsonb) with every number it holds exactly: as a Python
    number where one is exact, else as an orjson.Fragment of its text, which every encoder
    here writes back unchanged."""
    return json.loads(raw, parse_float=_float_unless_rounded, parse_int=_exact_int)


class RoundedOutOfRange(ValueError):
    """A timestamp past the last instant once rounded to microseconds; `loc` is its place."""

    def __init__(self, loc: tuple[str | int, ...]) -> None:
        super().__init__("is out of range once rounded to microseconds")
        self.loc = loc


def with_exact_values(model: BaseModel, tree: Any, at: tuple[str | int, ...] = ()) -> None:
    """Make `model` (validated from the JSON of which `tree` is `exact_json`) hold what
    PostgreSQL would read from that JSON: its client JSON fields (payloads, results,
    progress) take the client's exact numbers, and its timestamps are rounded like
    PostgreSQL's (`rounded_like_postgresql`), at any depth of submodels and lists of them.
    RoundedOutOfRange for a timestamp rounded past the last instant."""
    if not isinstance(tree, dict):
        return
    for name, field in type(model).model_fields.items():
        if name not in tree:
            continue
        value, given = getattr(model, name), tree[name]
        if CLIENT_JSON in field.metadata:
            setattr(model, name, given)
        elif isinstance(value, datetime) and isinstance(given, str):
            try:
                setattr(model, name, _storable_in_utc(rounded_like_postgresql(value, given)))
            except (OverflowError, ValueError):
                raise RoundedOutOfRange((*at, name)) from None
        elif isinstance(value, BaseModel):
            with_exact_values(value, given, (*at, name))
        elif isinstance(value, list) and isinstance(given, list):
            for index, (item, branch) in enumerate(zip(value, given, strict=False)):
                if isinstance(item, BaseModel):
                    with_exact_values(item, branch, (*at, name, index))
