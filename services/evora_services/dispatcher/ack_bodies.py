"""Reading the bodies that carry acks (POST /v1/claim and POST /v1/acks): the hot path of a
drain, one body of up to a thousand outcomes per claim.

The documented models check each ack's `result` with a validator of its own, a Python call
per item that cost about as much as the rest of parsing a claim. So a body is parsed first
by the same models without that per-item call, and the results are then checked in one loop
that keeps their encoding, which is what the database is sent. A body the lean model or
that loop refuses is parsed again by the documented model, so it is answered exactly as
before (same problem, same errors, same locations); a well-formed body is parsed once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import Field, ValidationError
from pydantic_core import PydanticCustomError

from evora.http.app import SETTINGS
from evora.http.bodies import exact_values, items_limit, problem_from, read_json_body
from evora.protocol.bounds import MAX_ACKS
from evora.protocol.fields import encode_client_json
from evora.protocol.worker import Ack, AcksRequest, ClaimRequest

M = TypeVar("M", ClaimRequest, AcksRequest)


class _LeanAck(Ack):
    result: Any = None  # checked for the whole body at once by `_encoded_results`


# The documented fields with the lean items; the bounds of `acks` are the documented ones
# (tests/dispatcher/test_ack_bodies.py holds both models to the same verdicts).
class _LeanClaim(ClaimRequest):
    acks: list[_LeanAck] | None = Field(default=None, max_length=MAX_ACKS)  # type: ignore[assignment]


class _LeanAcks(AcksRequest):
    acks: list[_LeanAck] = Field(min_length=1, max_length=MAX_ACKS)  # type: ignore[assignment]


def _encoded_results(acks: Sequence[Ack], limit: int) -> list[orjson.Fragment] | None:
    """Each ack's result as the documented model would accept it, encoded; None if any is
    refused (the documented model then says why, with its location). An ack that sent no
    result is not checked there, so its null is not checked here either."""
    encoded: list[orjson.Fragment] = []
    try:
        for ack in acks:
            if "result" in ack.model_fields_set:
                encoded.append(orjson.Fragment(encode_client_json(ack.result, "result", limit)))
            else:
                encoded.append(_NULL)
    except (ValueError, PydanticCustomError):
        return None
    return encoded


_NULL = orjson.Fragment(b"null")


async def _read(
    request: web.Request, lean: type[M], full: type[M], acks_of: Callable[[M], Sequence[Ack]]
) -> tuple[M, list[orjson.Fragment]]:
    max_payload_bytes = request.app[SETTINGS].max_payload_bytes
    limit = items_limit(max_payload_bytes)
    raw = await read_json_body(request, limit)
    context = {"max_payload_bytes": max_payload_bytes}
    try:
        body = lean.model_validate_json(raw, context=context)
    except ValidationError:
        pass
    else:
        results = _encoded_results(acks_of(body), max_payload_bytes)
        if results is not None:
            return body, _exact_results(raw, results)
    try:
        body = full.model_validate_json(raw, context=context)
    except ValidationError as exc:
        raise problem_from(exc) from None
    return body, _exact_results(
        raw, [orjson.Fragment(orjson.dumps(ack.result)) for ack in acks_of(body)]
    )


def _exact_results(raw: bytes | bytearray, results: list[orjson.Fragment]) -> list[orjson.Fragment]:
    """The results with the numbers exactly as the body writes them (the parser made floats
    of them), if it has such numbers; in the order of the acks, as `results`."""
    tree = exact_values(raw)
    if tree is None:
        return results
    return [
        orjson.Fragment(orjson.dumps(ack["result"])) if "result" in ack else _NULL
        for ack in tree.get("acks") or ()
    ]


async def read_claim(request: web.Request) -> tuple[ClaimRequest, list[orjson.Fragment]]:
    """The claim, and the result of each of its acks encoded (in order)."""
    return await _read(request, _LeanClaim, ClaimRequest, lambda body: body.acks or ())


async def read_acks(request: web.Request) -> tuple[AcksRequest, list[orjson.Fragment]]:
    """The acks, and the result of each encoded (in order)."""
    return await _read(request, _LeanAcks, AcksRequest, lambda body: body.acks)
