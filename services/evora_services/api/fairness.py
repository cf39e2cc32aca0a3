"""The fairness endpoints (docs/http-api.md, docs/flow-control.md "Fairness keys"): the
weight of a fairness key or prefix, and what the fair claim served a key. The claim applies
the weights; the api only stores them."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from aiohttp import web
from pydantic import ConfigDict, Field

from evora.config import Role
from evora.http.bodies import parse_body, parse_query
from evora.http.jsonio import json_response
from evora.http.problems import Problem, validation_problem
from evora.http.routing import Routes
from evora.protocol.bounds import LIMIT_NAME_PATTERN, MAX_PAGE
from evora.protocol.fields import LazyModel, QueueName, WireModel
from evora.storage.fairness import FairnessStore
from evora_services.api.routes import SMALL_BODY_LIMIT
from evora_services.api.stats import LimitCursor, encode_key

FAIRNESS = web.AppKey("fairness", FairnessStore)

ADMIN: tuple[Role, ...] = ("admin",)
# A key (`tenant:42`) or a prefix's (`tenant:*`), in the limit keys' alphabet.
FairnessName = Annotated[str, Field(pattern=LIMIT_NAME_PATTERN)]
_KEY = re.compile(LIMIT_NAME_PATTERN)

fairness = Routes("fairness", path={"key": FairnessName}, problems=(503,))


class WeightBody(WireModel):
    weight: float = Field(
        ge=0.001,
        le=1000,
        description="the key's share of a contended queue relative to the others' (default 1)",
    )


class Weight(LazyModel):
    key: str
    weight: float
    changed_at: datetime


class KeyService(LazyModel):
    queue: str
    served: int = Field(description="jobs the fair claim started for the key")
    held_seconds: float = Field(description="lease seconds its ended attempts held")
    running: int = Field(description="its attempts not ended yet")
    backlogged: bool = Field(description="it had work waiting at the queue's last claim")
    lag: float = Field(description="its virtual finish ahead of the queue's virtual time")


class KeyWeight(LazyModel):
    key: str
    weight: float = Field(description="the weight that applies: its own, a prefix's, else 1")
    set_by: str | None = Field(description="the key or prefix that set it; null: the default")
    queues: list[KeyService]


class FairQueue(LazyModel):
    queue: str
    keys: int = Field(description="the keys the queue's fair claims have served or noted")
    backlogged_keys: int = Field(description="those its claims walk now: they have work")


class KeyState(LazyModel):
    key: str
    weight: float = Field(description="the weight that applies: its own, a prefix's, else 1")
    set_by: str | None = Field(description="the key or prefix that set it; null: the default")
    served: int = Field(description="jobs the fair claim started for the key")
    running: int = Field(description="its attempts not settled yet")
    held_seconds: float = Field(description="lease seconds its ended attempts held")
    backlogged: bool = Field(description="the queue's claims walk it: it has work")
    backlog: int = Field(description="its due PENDING jobs")
    longest_wait_seconds: float | None = Field(
        description="how long the longest of them has been due; null: none is"
    )
    held_share: float | None = Field(
        description="its part of the lease seconds the queue's keys held; null: none held yet"
    )
    weight_share: float = Field(
        description="its weight over the sum of the queue's keys' weights: its share while "
        "every key has work"
    )


class FairnessPage(LazyModel):
    queues: list[FairQueue] = Field(description="every fair queue")
    keys: list[KeyState] = Field(description="a page of `queue`'s keys, in key order")
    next: str | None = Field(description="pass as `after` for the next page; null at the end")


class FairnessQuery(LazyModel):
    # lax (query values are strings); unknown parameters refused, not silently ignored
    model_config = ConfigDict(extra="forbid")

    queue: QueueName | None = Field(default=None, description="the queue whose keys to list")
    limit: int = Field(default=50, ge=1, le=MAX_PAGE)
    after: LimitCursor | None = None


def _store(request: web.Request) -> FairnessStore:
    return request.app[FAIRNESS]


def _key(request: web.Request) -> str:
    """The `{key}` of the path; a key no weight or job can have is refused, as the OpenAPI
    document's pattern says."""
    key = request.match_info["key"]
    if not _KEY.fullmatch(key):
        raise _invalid_key()
    return key


def _invalid_key() -> Problem:
    return validation_problem(
        [
            {
                "loc": ["path", "key"],
                "msg": f"a fairness key matches {LIMIT_NAME_PATTERN}",
                "type": "string_pattern_mismatch",
            }
        ]
    )


@fairness.add(
    "GET",
    "/v1/fairness",
    roles=ADMIN,
    summary=(
        "The fair queues and, for `queue`, a page of its keys in key order (pass `next` as "
        "`after`): each key's weight and who set it, due backlog, longest wait, and its share "
        "of the held lease time against its weight's share."
    ),
    query=FairnessQuery,
    responses={200: FairnessPage},
)
async def list_fairness(request: web.Request) -> web.Response:
    query = parse_query(request, FairnessQuery)
    store = _store(request)
    queues = await store.queues()
    if query.queue is None:
        return json_response({"queues": queues, "keys": [], "next": None})
    page = await store.keys(query.queue, after=query.after, limit=query.limit)
    cursor = None if page.next_after is None else encode_key([page.next_after])
    return json_response({"queues": queues, "keys": page.keys, "next": cursor})


@fairness.add(
    "PUT",
    "/v1/fairness/{key}",
    roles=ADMIN,
    summary=(
        "Set the weight of a fairness key (`tenant:*`: every key under the prefix, each on "
        "its own): 201 when new, 200 when replaced. The next claims use it."
    ),
    body=WeightBody,
    responses={201: Weight, 200: Weight},
)
async def put_weight(request: web.Request) -> web.Response:
    key = _key(request)
    body = await parse_body(request, WeightBody, limit=SMALL_BODY_LIMIT)
    weight, created = await _store(request).put(key, body.weight)
    return json_response(weight, status=201 if created else 200)


@fairness.add(
    "GET",
    "/v1/fairness/{key}",
    roles=ADMIN,
    summary=(
        "The weight that applies to the key (its own, the longest prefix's, else 1) and, per "
        "queue, what the fair claim served it."
    ),
    responses={200: KeyWeight},
    problems=(422,),
)
async def get_weight(request: web.Request) -> web.Response:
    return json_response(await _store(request).get(_key(request)))


@fairness.add(
    "DELETE",
    "/v1/fairness/{key}",
    roles=ADMIN,
    summary=(
        "Drop the key's own weight: it falls back to its prefix's, else 1. 204 whether or "
        "not it had one."
    ),
    responses={204: None},
    problems=(422,),
)
async def delete_weight(request: web.Request) -> web.Response:
    await _store(request).delete(_key(request))
    return web.Response(status=204)
