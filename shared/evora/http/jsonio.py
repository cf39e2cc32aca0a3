"""JSON in and out: orjson for speed, RFC 3339 UTC timestamps with a `Z`."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import orjson
from aiohttp import web

JSON_OPTIONS = orjson.OPT_UTC_Z | orjson.OPT_NON_STR_KEYS


def _default(value: Any) -> Any:
    # asyncpg returns ids as its own UUID subclass, which orjson only serialises natively
    # when the type is exactly uuid.UUID.
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, default=_default, option=JSON_OPTIONS)


def json_response(
    data: Any, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=dumps(data), status=status, headers=headers, content_type="application/json"
    )
