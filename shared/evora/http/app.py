"""The app factory every service starts from: middleware (request ids, auth, problem+json,
metrics), `/healthz`, `/readyz`, `/metrics`, `/openapi.json`."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from evora.config import Settings
from evora.domain.errors import EvoraError
from evora.http.auth import TokenTable, authorize
from evora.http.bodies import ClientDisconnected
from evora.http.budget import BODY_BUDGETS, BODY_RESERVED, BodyBudgets
from evora.http.jsonio import json_response
from evora.http.metrics import ServiceMetrics
from evora.http.openapi import openapi_document
from evora.http.problems import Problem, unavailable
from evora.http.protocol import EdgeProtocol
from evora.http.routing import Routes, endpoint_of, install
from evora.logs import bind as bind_log_context
from evora.logs import unbind as unbind_log_context
from evora.protocol import problems
from evora.storage.db import create_pool, request_budget
from evora.storage.migrate import missing_versions, stale_function_files

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

# Readiness check: None when fine, else the reason the service is not ready.
ReadinessCheck = Callable[[], Awaitable[str | None]]

# /readyz answers from checks at most this old: the orchestrator's probes and every worker
# that backs off after failed claims (each asking about once a second, evora.sdk.worker)
# then cost one round of checks per interval, however many ask.
READINESS_CACHE_SECONDS = 0.5

REQUEST_ID_HEADER = "X-Request-Id"
# The largest body any endpoint accepts; each endpoint applies its own smaller limit while
# it reads (evora.http.bodies), so this only backs up aiohttp's own readers.
ABSOLUTE_BODY_LIMIT = 256 * 1024 * 1024
# nginx's "client closed request": counted apart from errors the service made.
CLIENT_CLOSED_REQUEST = 499
# How long each use of the database by a request may take (waiting for a pool connection,
# then its statements) before the request is answered 503 (see evora.storage.db).
DATABASE_BUDGET_S = 10.0


@dataclass
class Lifecycle:
    """Set when the process starts draining, so /readyz fails before listeners stop."""

    draining: bool = False


class ReadinessCache:
    """The reasons the service is not ready (empty: ready), checked at most once per
    `READINESS_CACHE_SECONDS`; concurrent askers wait for the one check under way."""

    def __init__(self, checks: list[ReadinessCheck]) -> None:
        self._checks = checks
        self._lock = asyncio.Lock()
        self._checked_at = -float("inf")
        self._failures: list[str] = []

    async def failures(self) -> list[str]:
        async with self._lock:
            if time.monotonic() - self._checked_at >= READINESS_CACHE_SECONDS:
                self._failures = [r for r in [await check() for check in self._checks] if r]
                self._checked_at = time.monotonic()
            return self._failures


SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", ServiceMetrics)
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
READINESS = web.AppKey("readiness", list[ReadinessCheck])
READINESS_CACHE = web.AppKey("readiness_cache", ReadinessCache)
TOKENS = web.AppKey("tokens", TokenTable)
DATABASE_BUDGET = web.AppKey("database_budget", float)
REQUEST_ID = web.RequestKey("request_id", str)
# The tracer of an app (None when the process does not trace: evora.tracing).
TRACER: web.AppKey[Tracer | None] = web.AppKey("tracer")

# Failures of the database, not of the request: the client may retry.
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.QueryCanceledError,
    asyncpg.AdminShutdownError,
)
# What a service's requests answer 503 for: DATABASE_UNAVAILABLE, and MongoDB's failures in a
# service that reads it (also_unavailable), so that the others never import pymongo (a tenth
# of a service's start-up CPU).
UNAVAILABLE = web.AppKey("unavailable", tuple[type[Exception], ...])
# A transaction PostgreSQL rolled back to settle a conflict with a concurrent one (the victim
# of a deadlock, a serialization failure): what it did is undone, and the request may be
# sent again, as after a lost connection. Not "statement completion unknown", the other
# error of that class, whose transaction may have committed.
DATABASE_CONFLICT = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)

_HTTP_CODES = {
    404: ("not_found", "Not found"),
    405: ("method_not_allowed", "Method not allowed"),
    413: (problems.PAYLOAD_TOO_LARGE, "Payload too large"),
}


def _problem_for_http_exception(exc: web.HTTPException) -> Problem:
    code, title = _HTTP_CODES.get(exc.status, ("http_error", exc.reason))
    # A 405 says which methods the resource allows.
    headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
    return Problem(exc.status, code, title, exc.text or exc.reason, headers=headers)


@web.middleware
async def _edge(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    request_id = request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
    request[REQUEST_ID] = request_id
    log_context = bind_log_context(request_id=request_id)  # on every record of the request
    metrics = request.app[METRICS]
    endpoint = endpoint_of(request)
    route = endpoint.path if endpoint else "unmatched"
    started = time.perf_counter()
    metrics.http_in_flight.labels(metrics.service).inc()
    if isinstance(request.protocol, EdgeProtocol):
        request.protocol.head_received()
    try:
        try:
            if endpoint is not None:
                authorize(request, endpoint, request.app[TOKENS])
            with request_budget(request.app[DATABASE_BUDGET]):
                response = await handler(request)
        except Problem as problem:
            response = problem.response()
        except EvoraError as error:
            response = Problem(
                error.status, error.code, error.title, error.detail, headers=error.headers
            ).response()
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            response = _problem_for_http_exception(exc).response()
        except ClientDisconnected as exc:
            log.debug("client left %s %s before its body arrived: %s", request.method, route, exc)
            response = web.Response(status=CLIENT_CLOSED_REQUEST)
        except request.app[UNAVAILABLE] as exc:
            log.warning("database unavailable in %s %s: %r", request.method, route, exc)
            response = unavailable(
                "the database is unavailable or overloaded; retry shortly"
            ).response()
        except DATABASE_CONFLICT as exc:
            log.warning("transaction undone in %s %s: %r", request.method, route, exc)
            response = unavailable(
                "the database undid this request's transaction to settle a conflict with a "
                "concurrent one; retry shortly"
            ).response()
        except Exception:
            log.exception(
                "unhandled error in %s %s (request %s)", request.method, route, request_id
            )
            response = Problem(
                500,
                problems.INTERNAL_ERROR,
                "Internal error",
                f"request {request_id} failed; see logs",
            ).response()
    finally:
        # The body and what was parsed from it are no longer held: its bytes go back.
        for budget, size in request.get(BODY_RESERVED, ()):
            budget.release(size)
        metrics.http_in_flight.labels(metrics.service).dec()
        unbind_log_context(log_context)
    metrics.http_requests.labels(metrics.service, request.method, route, str(response.status)).inc()
    metrics.http_latency.labels(metrics.service, request.method, route).observe(
        time.perf_counter() - started
    )
    if not response.prepared:
        response.headers[REQUEST_ID_HEADER] = request_id
    return response


async def open_pool(
    app: web.Application, service: str, *, generic_plans: bool = False
) -> asyncpg.Pool:
    """The service's pool, registered for /readyz. min_size=0: connections open on first
    use, so the service starts (and /readyz says why it is not ready) while PostgreSQL is
    still coming up, instead of crash-looping until it is. `generic_plans`: create_pool's."""
    settings = app[SETTINGS]
    settings.require("database_url")
    assert settings.database_url is not None
    pool = await create_pool(
        settings.database_url,
        application_name=f"evora-{service}",
        min_size=0,
        max_size=settings.db_pool_size,
        pooler=settings.database_pooler,
        generic_plans=generic_plans,
    )
    ready = database_ready(pool)
    app[READINESS].append(ready)
    # Said at start-up: a service whose database is down (or lacks migrations) still starts,
    # and would otherwise answer 503 in silence, only /readyz saying why.
    if (reason := await ready()) is not None:
        log.warning("%s: answering 503 until that changes (/readyz says why)", reason)
    return pool


def database_ready(pool: asyncpg.Pool) -> ReadinessCheck:
    async def check() -> str | None:
        try:
            async with pool.acquire(timeout=2) as conn:
                missing = await missing_versions(conn)
                stale = await stale_function_files(conn)
        except Exception as exc:  # any failure means "not ready", with the reason
            return f"PostgreSQL unreachable: {exc.__class__.__name__}"
        if missing:
            return f"database schema lacks migrations {missing} (run `evora migrate`)"
        if stale:
            return f"database functions are older than function files {stale} (run `evora migrate`)"
        return None

    return check


def _ops_routes(title: str) -> Routes:
    ops = Routes("operations")

    @ops.add("GET", "/healthz", roles=None, summary="The process is alive.")
    async def healthz(request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    @ops.add(
        "GET",
        "/readyz",
        roles=None,
        summary="Dependencies reachable and migrations current (503 otherwise).",
        responses={200: None, 503: None},
    )
    async def readyz(request: web.Request) -> web.Response:
        if request.app[LIFECYCLE].draining:
            return json_response({"status": "draining"}, status=503)
        failures = await request.app[READINESS_CACHE].failures()
        if failures:
            return json_response({"status": "unavailable", "reasons": failures}, status=503)
        return json_response({"status": "ready"})

    @ops.add(
        "GET",
        "/metrics",
        roles=None,
        summary="Prometheus metrics.",
        content_type=CONTENT_TYPE_LATEST,
    )
    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(request.app[METRICS].registry)
        response = web.Response(body=body)
        response.content_type = "text/plain"
        response.charset = "utf-8"
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    @ops.add("GET", "/openapi.json", roles=None, summary="This service's OpenAPI 3.1 document.")
    async def openapi(request: web.Request) -> web.Response:
        return json_response(openapi_document(request.app, title))

    return ops


def also_unavailable(app: web.Application, *errors: type[Exception]) -> None:
    """Requests that fail with one of `errors` (another database's) are answered 503 too."""
    app[UNAVAILABLE] = (*app[UNAVAILABLE], *errors)


def create_base_app(settings: Settings, service: str, title: str) -> web.Application:
    app = web.Application(middlewares=[_edge], client_max_size=ABSOLUTE_BODY_LIMIT)
    app[SETTINGS] = settings
    app[METRICS] = ServiceMetrics(service)
    app[LIFECYCLE] = Lifecycle()
    app[READINESS] = []
    app[READINESS_CACHE] = ReadinessCache(app[READINESS])
    app[TOKENS] = TokenTable(settings.token_roles() if settings.auth_enabled else None)
    app[DATABASE_BUDGET] = DATABASE_BUDGET_S
    app[UNAVAILABLE] = DATABASE_UNAVAILABLE
    app[BODY_BUDGETS] = BodyBudgets.of(settings.body_budget)
    install(app, _ops_routes(title))
    return app
