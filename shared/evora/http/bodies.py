"""Reading and validating request bodies and query strings at the edge (rule 10 of
docs/architecture.md).

What one body may cost is bounded before it becomes Python objects:

- its size in bytes (413 before the rest is read, from Content-Length when declared);
- how fast it arrives (408 when it trickles in slower than `MIN_BODY_RATE` after a grace);
- for bodies of many items (batches, acks), how many JSON values it holds (413): parsed
  JSON costs up to ~80 bytes of memory per value (`[[],[],...]` is 3 bytes per list), so
  bytes alone do not bound memory. A body of many items may hold as many values as one
  largest payload can, so it never costs more to parse than a single submission;
- how deep it nests: the parser stops at `MAX_DEPTH` levels (422).

The checks are O(bytes) in C (`bytes.count`, `bytes.translate`, `in`, `re`), and the
costlier ones (removing strings to count exactly, finding NaN outside strings) run only for
bodies that need them.
Then pydantic parses and validates in one pass (strict JSON). Every failure is a problem:
400 malformed_json, 408 request_timeout, 413 payload_too_large, or 422 validation_error
with the location of each error.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from evora.http.budget import BODY_BUDGET_WAIT_S, BODY_BUDGETS, BODY_RESERVED, ByteBudget
from evora.http.problems import (
    Problem,
    malformed_json,
    payload_too_large,
    request_timeout,
    unavailable,
    validation_problem,
)
from evora.protocol.bounds import KIB, items_body_bytes
from evora.protocol.fields import (
    DIGITS_AS_ZERO,
    RoundedOutOfRange,
    exact_json,
    json_skeleton,
    with_exact_values,
)
from evora.protocol.problems import PAYLOAD_TOO_LARGE

M = TypeVar("M", bound=BaseModel)

# A body must arrive at this average rate once the grace period is over: a client that
# trickles bytes cannot hold a connection (and its buffer) open for long.
BODY_GRACE_S = 10.0
MIN_BODY_RATE = 64 * KIB  # bytes per second

# Values of the items' own fields (ids, queue, type, outcome...) besides their payloads.
ITEMS_ENVELOPE_VALUES = 64 * KIB

# What one JSON value may cost once parsed: `[[],[],...]` makes a 56-byte list of every 3
# bytes, plus the list slot holding it.
PARSED_VALUE = 80

# The depth at which pydantic's JSON parser (jiter) stops; the body's own object counts.
MAX_DEPTH = 200


@dataclass(frozen=True)
class ItemsLimit:
    """What one body of many items may hold: bytes, and JSON values (objects to build)."""

    bytes: int
    values: int


def items_limit(max_payload_bytes: int) -> ItemsLimit:
    # Values are counted as the characters `,:[{`, so a payload of n bytes counts at most
    # 2n/3 (`[[],[],...]`): any single payload that fits EVORA_MAX_PAYLOAD_BYTES fits here.
    return ItemsLimit(
        bytes=items_body_bytes(max_payload_bytes),
        values=max_payload_bytes * 2 // 3 + ITEMS_ENVELOPE_VALUES,
    )


class ClientDisconnected(Exception):
    """The client went away before its body arrived: nobody to answer, nothing failed."""


# pydantic's parser accepts these, but they are not JSON.
_NOT_JSON = re.compile(rb"NaN|Infinity")
# A number whose magnitude might not fit a double (pydantic reads it as infinity, which
# would be stored as null): a positive exponent of three digits, or 300 digits. Matched
# only from the start of a run of digits, possessively, so a body of long digit runs
# costs linear time, not quadratic.
_HUGE_NUMBER = re.compile(
    rb"(?<![0-9.])(?:[0-9.]++[eE]\+?+[0-9]{3,}+|(?=[0-9.]{300})[0-9.]++(?:[eE][+-]?+[0-9]++)?)"
)
_HUGE_HINTS = (b"e000", b"e+000", b"0" * 300)


def _might_hold_huge_number(raw: bytes | bytearray) -> bool:
    flat = raw.translate(DIGITS_AS_ZERO)
    return any(hint in flat for hint in _HUGE_HINTS)


# A number that a float or a 64-bit integer would not hold as written: one with a fraction
# or an exponent, or 19 digits or more. In the text with digits as 0 (`DIGITS_AS_ZERO`), each
# is one of these substrings; strings may hold them too, which only costs the exact parse.
# A timestamp with more than six digits of fraction shows as `:00.0000000` there.
_INEXACT_HINTS = (b"0.", b"0e", b"0" * 19)
# The same, in the skeleton (no strings left): a digit then `.` or `e` is inside a number.
_INEXACT_NUMBER = re.compile(rb"[0-9][.eE]|[0-9]{19}")
_SUB_MICROSECOND = re.compile(rb":[0-9]{2}[.,][0-9]{7}")


def _value_count(raw: bytes | bytearray) -> int:
    """The values and keys the JSON holds, containers twice (they cost about twice as much
    as a scalar): each value follows one of `,:[`, or is the root, and each container
    also opens with `[` or `{`. Characters inside strings count too, so this may be more."""
    return raw.count(b",") + raw.count(b":") + raw.count(b"[") + raw.count(b"{") + 1


def _is_infinite(number: bytes) -> bool:
    try:
        return math.isinf(float(number))
    except ValueError:  # not a number after all; the parser says what is wrong
        return False


class _Scan:
    """Checks of the raw body; the copy without strings is made at most once, if needed."""

    def __init__(self, raw: bytes | bytearray) -> None:
        self.raw = raw
        self._skeleton: bytes | None = None

    @property
    def skeleton(self) -> bytes:
        """The body with every string emptied: what is left is structure, numbers and
        literals, so a match there is never text a client sent inside a string."""
        if self._skeleton is None:
            self._skeleton = json_skeleton(self.raw)
        return self._skeleton

    def check_values(self, limit: int) -> None:
        if _value_count(self.raw) <= limit:
            return
        count = _value_count(self.skeleton)
        if count > limit:
            raise payload_too_large(
                f"the body holds about {count} JSON values; the limit is {limit} "
                "(send fewer or smaller items per request)"
            )

    def holds_inexact_values(self) -> bool:
        """Whether it may hold a number a float or a 64-bit integer would change, or a
        timestamp finer than microseconds (`keep_exact_values`)."""
        flat = self.raw.translate(DIGITS_AS_ZERO)
        if not any(hint in flat for hint in _INEXACT_HINTS):
            return False
        return _INEXACT_NUMBER.search(self.skeleton) is not None or (
            b":00.0000000" in flat and _SUB_MICROSECOND.search(self.raw) is not None
        )

    def check_literals(self) -> None:
        raw = self.raw
        if (b"NaN" in raw or b"Infinity" in raw) and _NOT_JSON.search(self.skeleton):
            raise malformed_json("the body is not valid JSON: NaN and Infinity are not JSON")
        # Ids in strings often look like a hint (`4e012...`): the skeleton tells, cheaply,
        # before the pattern has to try every position of it.
        if _might_hold_huge_number(raw) and _might_hold_huge_number(self.skeleton):
            for number in _HUGE_NUMBER.finditer(self.skeleton):
                if _is_infinite(number[0]):
                    shown = number[0][:40].decode()
                    raise validation_problem(
                        [{"loc": [], "msg": f"{shown}... is out of range", "type": "number_range"}]
                    )


def check_raw_json(raw: bytes | bytearray, *, max_values: int | None = None) -> None:
    """The checks made before parsing: at most `max_values` values (if given), and no
    NaN, Infinity or number beyond a double outside strings."""
    scan = _Scan(raw)
    if max_values is not None:
        scan.check_values(max_values)
    scan.check_literals()


async def read_body(request: web.Request, limit: int) -> bytearray:
    """The body, within `limit` bytes and the process's budget of body bytes
    (evora.http.budget): a declared length is reserved before the first byte is read, a
    chunked body piece by piece."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise payload_too_large(f"the body is {declared} bytes; the limit is {limit}")
    body = bytearray()
    loop = asyncio.get_running_loop()
    started = loop.time()
    bodies = request.app[BODY_BUDGETS].bodies
    if declared:
        await _reserve(request, bodies, declared)
    try:
        while True:
            deadline = started + BODY_GRACE_S + len(body) / MIN_BODY_RATE
            async with asyncio.timeout_at(deadline):
                chunk = await request.content.readany()
            if not chunk:
                return body
            if len(body) + len(chunk) > limit:
                raise payload_too_large(f"the body is over the limit of {limit} bytes")
            if declared is None:
                await _reserve(request, bodies, len(chunk))
            body += chunk
    except TimeoutError:
        raise request_timeout(
            f"the body did not arrive in time ({len(body)} bytes in "
            f"{loop.time() - started:.0f}s; at least {MIN_BODY_RATE // KIB} KiB/s after "
            f"{BODY_GRACE_S:.0f}s)"
        ) from None
    except (ConnectionError, web.RequestPayloadError) as exc:
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ClientDisconnected(str(exc)) from None
        raise Problem(
            400, "malformed_body", "Malformed body", f"the body could not be read: {exc}"
        ) from None


async def _reserve_parsing(request: web.Request, raw: bytes | bytearray) -> None:
    """Reserve what parsing `raw` will cost in the process's budget (evora.http.budget):
    its strings become Python strings, each of its values an object of up to PARSED_VALUE
    bytes; an estimate above the whole budget is held as the whole budget (the request then
    parses alone)."""
    parsing = request.app[BODY_BUDGETS].parsing
    cost = len(raw) + PARSED_VALUE * _value_count(raw)
    await _reserve(request, parsing, min(cost, parsing.capacity))


async def _reserve(request: web.Request, budget: ByteBudget, size: int) -> None:
    deadline = asyncio.get_running_loop().time() + BODY_BUDGET_WAIT_S
    try:
        await budget.reserve(size, deadline)
    except TimeoutError:
        raise unavailable(
            f"this process's request bodies take {budget.held // KIB} KiB of the "
            f"{budget.capacity // KIB} KiB it allows them (EVORA_BODY_BUDGET_BYTES); "
            "retry shortly",
            title="Service busy",
        ) from None
    request.setdefault(BODY_RESERVED, []).append((budget, size))


def problem_from(exc: ValidationError) -> Problem:
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    for error in errors:
        if error["type"] == "json_invalid":
            if "recursion limit" in error["msg"]:
                return validation_problem(
                    [
                        {
                            "loc": [],
                            "msg": f"the JSON nests more than {MAX_DEPTH} levels deep",
                            "type": "too_deep",
                        }
                    ]
                )
            return malformed_json(f"the body is not valid JSON: {error['msg']}")
    for error in errors:
        if error["type"] == PAYLOAD_TOO_LARGE:
            where = ".".join(str(part) for part in error["loc"])
            return payload_too_large(f"{where}: {error['msg']}")
    return validation_problem(
        [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errors]
    )


async def read_json_body(request: web.Request, limit: int | ItemsLimit) -> bytes | bytearray:
    """The raw body, read within `limit` (bytes, or bytes and values for a body of many
    items) and checked as JSON text can be before parsing. An empty body counts as `{}` so
    that a missing field is reported by name rather than as broken JSON."""
    if isinstance(limit, ItemsLimit):
        raw = await read_body(request, limit.bytes)
        check_raw_json(raw, max_values=limit.values)
    else:
        raw = await read_body(request, limit)
        check_raw_json(raw)
    await _reserve_parsing(request, raw)
    return raw or b"{}"


def validate_body(
    raw: bytes | bytearray, model: type[M], context: Mapping[str, Any] | None = None
) -> M:
    """A body from `read_json_body` as `model`; a problem when it is not one."""
    try:
        body = model.model_validate_json(raw, context=dict(context or {}))
    except ValidationError as exc:
        raise problem_from(exc) from None
    return keep_exact_values(raw, body)


def exact_values(raw: bytes | bytearray) -> Any:
    """`exact_json(raw)` when `raw` may hold a number a float or a 64-bit integer would
    change, or a timestamp finer than microseconds; else None (the parse is not needed)."""
    return exact_json(raw) if _Scan(raw).holds_inexact_values() else None


def keep_exact_values(raw: bytes | bytearray, body: M) -> M:
    """`body` (validated from `raw`) holding what PostgreSQL reads from `raw`, as
    evora.submit does (`with_exact_values`): the client JSON it carries (payloads, results,
    progress) with the numbers exactly as written (the parser made floats of them:
    12345678901234567.89 became 12345678901234568, 1e2 became 100.0), its timestamps rounded
    to microseconds (the parser truncates). A body without such values is left as it is;
    only one that may hold them is parsed again (the stdlib's parser, numbers as text)."""
    tree = exact_values(raw)
    if tree is not None:
        try:
            with_exact_values(body, tree)
        except RoundedOutOfRange as exc:
            raise validation_problem(
                [{"loc": list(exc.loc), "msg": str(exc), "type": "value_error"}]
            ) from None
    return body


async def parse_body(
    request: web.Request,
    model: type[M],
    *,
    limit: int | ItemsLimit,
    context: Mapping[str, Any] | None = None,
) -> M:
    """The body as `model`, read within `limit` (`read_json_body`)."""
    return validate_body(await read_json_body(request, limit), model, context)


def parse_query(request: web.Request, model: type[M]) -> M:
    try:
        return model.model_validate(dict(request.query))
    except ValidationError as exc:
        raise problem_from(exc) from None
