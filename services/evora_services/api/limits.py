"""The limit endpoints (docs/http-api.md, docs/flow-control.md): concurrency and rate
limits by key, and their live usage. The claim enforces them; the api only stores them."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from aiohttp import web
from pydantic import ConfigDict, Field

from evora.config import Role
from evora.domain.errors import LimitNotFound
from evora.http.bodies import parse_body, parse_query
from evora.http.jsonio import json_response
from evora.http.problems import Problem, validation_problem
from evora.http.routing import Routes
from evora.protocol.bounds import LIMIT_NAME_PATTERN, MAX_PAGE
from evora.protocol.fields import LazyModel, WireModel
from evora.storage.limits import LimitSpec, LimitStore
from evora.storage.limits import Rate as StoredRate
from evora_services.api.routes import SMALL_BODY_LIMIT
from evora_services.api.stats import LimitCursor, encode_key

LIMITS = web.AppKey("limits", LimitStore)

ADMIN: tuple[Role, ...] = ("admin",)
# A producer may read one key's limit and usage: its `room` is what to ask before a large
# batch (docs/flow-control.md, "Admission").
READERS: tuple[Role, ...] = ("admin", "producer")
# A key (`tenant:42`, `queue:emails`) or a prefix limit's key (`tenant:*`).
LimitName = Annotated[str, Field(pattern=LIMIT_NAME_PATTERN)]
_KEY = re.compile(LIMIT_NAME_PATTERN)

limits = Routes("limits", path={"key": LimitName}, problems=(503,))


class Rate(WireModel):
    limit: int = Field(ge=1, le=2**31 - 1, description="the bucket's capacity, in claims")
    per_seconds: float = Field(
        gt=0, le=10 * 365 * 24 * 3600, description="seconds to refill a whole bucket"
    )


class LimitBody(WireModel):
    concurrency: int | None = Field(
        ge=1, le=2**31 - 1, description="at most this many jobs holding the key RUNNING"
    )
    rate: Rate | None = Field(description="at most `limit` claims per `per_seconds`")
    max_pending: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description=(
            "at most this many jobs holding the key waiting to run (PENDING or WAITING): a "
            "submission that would exceed it is refused with 429 `queue_full`"
        ),
    )


class Limit(LazyModel):
    key: str
    concurrency: int | None
    rate: Rate | None
    max_pending: int | None
    created_at: datetime
    updated_at: datetime


class Usage(LazyModel):
    """A concrete key's live usage under the limit that governs it."""

    running: int = Field(description="RUNNING jobs holding the key")
    tokens: float | None = Field(
        description="tokens in the key's bucket now; null without a rate, or for a prefix"
    )
    throttled_jobs: int = Field(
        description=(
            "due PENDING jobs holding the key while it has no room left (0 while it has), "
            "counted up to 1,000: 1,000 means at least that many"
        )
    )
    throttled_since: datetime | None = Field(
        description="when the longest held back of those jobs became due; null when none is"
    )
    throttled_until: datetime | None = Field(
        default=None,
        description=(
            "until when an upstream throttles the key: a worker reported its rate-limit answer "
            "(`retry_after` on a failure) and no job holding the key starts before then; null "
            "when none does, and for a prefix limit's own key (see its keys)"
        ),
    )


class Admission(LazyModel):
    """A concrete key's room under a max_pending (null without one, and for a prefix
    limit's own key): ask before a large batch, which is admitted whole or refused whole."""

    pending: int | None = Field(
        description="jobs holding the key waiting to run (PENDING or WAITING)"
    )
    room: int | None = Field(
        description="how many more jobs holding the key a submission may add now"
    )


class GovernedLimit(Limit):
    governed_by: str = Field(
        description="the key of the limit that applies: the key's own, or a prefix limit's"
    )


class LimitUsage(GovernedLimit, Usage, Admission):
    pass


class GovernedKey(Usage):
    key: str


class GovernedKeyPage(LazyModel):
    limit: GovernedLimit
    keys: list[GovernedKey]
    next: str | None = Field(description="pass as `after` for the next page; null at the end")


class LimitList(LazyModel):
    limits: list[Limit]
    next: str | None = Field(description="pass as `after` for the next page; null at the end")


class LimitListQuery(LazyModel):
    # lax (query values are strings); unknown parameters refused, not silently ignored
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=MAX_PAGE)
    after: LimitCursor | None = None


def _store(request: web.Request) -> LimitStore:
    return request.app[LIMITS]


def _key(request: web.Request) -> str:
    """The `{key}` of the path. A key no limit could have has none: 404."""
    key = request.match_info["key"]
    if not _KEY.fullmatch(key):
        raise LimitNotFound(f"no limit governs key {key!r}")
    return key


def _invalid_key() -> Problem:
    return validation_problem(
        [
            {
                "loc": ["path", "key"],
                "msg": f"a limit key matches {LIMIT_NAME_PATTERN}",
                "type": "string_pattern_mismatch",
            }
        ]
    )


@limits.add(
    "PUT",
    "/v1/limits/{key}",
    roles=ADMIN,
    summary=(
        "Create or replace the limit of a key (`tenant:*`: every key under the prefix, each "
        "on its own): 201 when new, 200 when replaced. Claims apply it at once."
    ),
    body=LimitBody,
    responses={201: Limit, 200: Limit},
)
async def put_limit(request: web.Request) -> web.Response:
    key = request.match_info["key"]
    if not _KEY.fullmatch(key):
        raise _invalid_key()
    body = await parse_body(request, LimitBody, limit=SMALL_BODY_LIMIT)
    rate = None if body.rate is None else StoredRate(body.rate.limit, body.rate.per_seconds)
    limit, created = await _store(request).put(
        key, LimitSpec(body.concurrency, rate, body.max_pending)
    )
    return json_response(limit, status=201 if created else 200)


@limits.add(
    "GET",
    "/v1/limits",
    roles=ADMIN,
    summary="Limits by key, a page at a time (pass `next` as `after`).",
    query=LimitListQuery,
    responses={200: LimitList},
)
async def list_limits(request: web.Request) -> web.Response:
    query = parse_query(request, LimitListQuery)
    page = await _store(request).page(after=query.after, limit=query.limit)
    cursor = None if page.next_after is None else encode_key([page.next_after])
    return json_response({"limits": page.limits, "next": cursor})


@limits.add(
    "GET",
    "/v1/limits/{key}",
    roles=READERS,
    summary=(
        "The limit that governs the key (its own or a prefix limit's) with the key's live "
        "usage: `GET /v1/limits/tenant:42` shows tenant:42's own count under `tenant:*`. "
        "Under a max_pending, `pending` and `room`: how many jobs holding the key a "
        "submission may add now (ask before a large batch)."
    ),
    responses={200: LimitUsage},
    problems=(404,),
)
async def get_limit(request: web.Request) -> web.Response:
    return json_response(await _store(request).usage(_key(request)))


@limits.add(
    "GET",
    "/v1/limits/{key}/keys",
    roles=ADMIN,
    summary=(
        "The concrete keys a limit governs, a page at a time in key order (pass `next` as "
        "`after`), each with its usage: for `tenant:*` the keys under `tenant:` without a "
        "limit of their own that were claimed under it or have RUNNING jobs; for any other "
        "key, that key."
    ),
    query=LimitListQuery,
    responses={200: GovernedKeyPage},
    problems=(404,),
)
async def list_governed_keys(request: web.Request) -> web.Response:
    query = parse_query(request, LimitListQuery)
    page = await _store(request).governed_keys(_key(request), after=query.after, limit=query.limit)
    cursor = None if page.next_after is None else encode_key([page.next_after])
    return json_response({"limit": page.limit, "keys": page.keys, "next": cursor})


@limits.add(
    "DELETE",
    "/v1/limits/{key}",
    roles=ADMIN,
    summary="Delete the limit of the key; its jobs are no longer held back by it.",
    responses={204: None},
    problems=(404,),
)
async def delete_limit(request: web.Request) -> web.Response:
    await _store(request).delete(_key(request))
    return web.Response(status=204)
