"""Endpoints declared once: the route, who may call it, and what it takes and answers.

The same declarations drive routing, the auth middleware and the OpenAPI document, so the
three can never disagree.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from pydantic import BaseModel

from evora.config import Role

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    handler: Handler
    roles: frozenset[Role] | None  # None: public
    summary: str
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    # status -> response model (None: no JSON body described)
    responses: dict[int, type[BaseModel] | None] = field(default_factory=dict)
    # problem statuses this endpoint may answer with, besides auth and validation
    problems: tuple[int, ...] = ()
    tag: str = ""
    content_type: str = "application/json"


class Routes:
    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.endpoints: list[Endpoint] = []

    def add(
        self,
        method: str,
        path: str,
        *,
        roles: tuple[Role, ...] | None,
        summary: str,
        body: type[BaseModel] | None = None,
        query: type[BaseModel] | None = None,
        responses: dict[int, type[BaseModel] | None] | None = None,
        problems: tuple[int, ...] = (),
        content_type: str = "application/json",
    ) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.endpoints.append(
                Endpoint(
                    method=method,
                    path=path,
                    handler=handler,
                    roles=None if roles is None else frozenset(roles),
                    summary=summary,
                    body=body,
                    query=query,
                    responses=responses or {200: None},
                    problems=problems,
                    tag=self.tag,
                    content_type=content_type,
                )
            )
            return handler

        return register


ENDPOINTS = web.AppKey("endpoints", dict[Handler, Endpoint])


def install(app: web.Application, *groups: Routes) -> None:
    table = app.setdefault(ENDPOINTS, {})
    for group in groups:
        for endpoint in group.endpoints:
            app.router.add_route(endpoint.method, endpoint.path, endpoint.handler)
            table[endpoint.handler] = endpoint


def endpoint_of(request: web.Request) -> Endpoint | None:
    route = request.match_info.route
    handler = getattr(route, "handler", None)
    if handler is None:
        return None
    return request.app[ENDPOINTS].get(handler) if ENDPOINTS in request.app else None


def all_endpoints(app: web.Application) -> list[Endpoint]:
    return list(app[ENDPOINTS].values()) if ENDPOINTS in app else []
