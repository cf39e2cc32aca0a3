"""Endpoints declared once: the route, who may call it, and what it takes and answers.

The same declarations drive routing, the auth middleware and the OpenAPI document, so the
three can never disagree.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

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
    # what a successful answer may be; the first is the one a JSON body model describes
    content_types: tuple[str, ...] = ("application/json",)
    # `{name}` of the path -> the type its value must have (e.g. UUID, QueueName); a name
    # missing here is any string
    path_params: Mapping[str, Any] = field(default_factory=dict)


class Routes:
    """A group of endpoints. `path` types the path parameters of every endpoint in the group
    (a name means the same in all of them), and `problems` are statuses every endpoint of
    the group may answer with (e.g. 503 when the database is unavailable)."""

    def __init__(
        self, tag: str, *, path: Mapping[str, Any] | None = None, problems: tuple[int, ...] = ()
    ) -> None:
        self.tag = tag
        self.path = dict(path or {})
        self.problems = problems
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
        content_type: str | tuple[str, ...] = "application/json",
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
                    problems=tuple(sorted({*problems, *self.problems})),
                    tag=self.tag,
                    content_types=(
                        (content_type,) if isinstance(content_type, str) else content_type
                    ),
                    path_params=self.path,
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
