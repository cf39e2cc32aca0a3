"""Reading and validating request bodies and query strings at the edge (rule 10).

Bodies are read with a hard cap (413 before reading the rest), parsed and validated in one
pass by pydantic (strict JSON), and every failure becomes a problem: 400 malformed_json,
413 payload_too_large, or 422 validation_error with the location of each error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from evora.domain.models import PAYLOAD_TOO_LARGE
from evora.http.problems import (
    Problem,
    malformed_json,
    payload_too_large,
    validation_problem,
)

M = TypeVar("M", bound=BaseModel)

# A number whose magnitude no double holds. pydantic reads it as infinity, which would be
# stored as null; such a body is refused instead. Only bodies with a candidate are re-read.
_HUGE_NUMBER = re.compile(rb"[0-9.][eE]\+?0*[0-9]{3,}|[0-9]{300,}")

_CHUNK = 64 * 1024


async def read_body(request: web.Request, limit: int) -> bytes:
    declared = request.content_length
    if declared is not None and declared > limit:
        raise payload_too_large(f"the body is {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise payload_too_large(f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def problem_from(exc: ValidationError) -> Problem:
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    for error in errors:
        if error["type"] == "json_invalid":
            return malformed_json(f"the body is not valid JSON: {error['msg']}")
    for error in errors:
        if error["type"] == PAYLOAD_TOO_LARGE:
            where = ".".join(str(part) for part in error["loc"])
            return payload_too_large(f"{where}: {error['msg']}")
    return validation_problem(
        [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in errors]
    )


async def parse_body(
    request: web.Request, model: type[M], *, limit: int, context: Mapping[str, Any] | None = None
) -> M:
    """The body as `model`. An empty body counts as `{}` so that a missing field is reported
    by name rather than as broken JSON."""
    raw = await read_body(request, limit)
    try:
        parsed = model.model_validate_json(raw or b"{}", context=dict(context or {}))
    except ValidationError as exc:
        raise problem_from(exc) from None
    if _HUGE_NUMBER.search(raw):
        try:
            orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise validation_problem(
                [{"loc": [], "msg": f"a number is out of range: {exc}", "type": "number_range"}]
            ) from None
    return parsed


def parse_query(request: web.Request, model: type[M]) -> M:
    try:
        return model.model_validate(dict(request.query))
    except ValidationError as exc:
        raise problem_from(exc) from None
