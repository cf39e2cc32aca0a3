"""The body budget as requests meet it (evora.http.budget, evora.http.bodies): what a body
reserves, that it is given back, and what a request that finds no room is answered. An app
of the shared factory with one route that reads a JSON body, served on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import orjson
import pytest
from aiohttp import web

from evora.config import Settings
from evora.http import bodies
from evora.http.app import create_base_app
from evora.http.bodies import PARSED_VALUE, read_json_body
from evora.http.budget import BODY_BUDGETS, BODY_RESERVED, BodyBudgets
from evora.http.routing import Routes, install
from evora.protocol.bounds import MIB
from tests.polling import until
from tests.servers import Service, serve

BUDGET = 32 * MIB  # the least the default limits allow: 16 MiB for bodies, 16 for parsing


@dataclass
class Served:
    service: Service
    budgets: BodyBudgets
    seen: list[list[tuple[str, int]]]  # each request's reservations: (budget, bytes)
    hold: asyncio.Event  # handlers wait for it once they have read their bodies
    reading: asyncio.Event  # set by every handler once it has its body


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    app = create_base_app(Settings(auth="disabled", body_budget_bytes=BUDGET), "api", "test")
    budgets = app[BODY_BUDGETS]
    names = {id(budgets.bodies): "bodies", id(budgets.parsing): "parsing"}
    seen: list[list[tuple[str, int]]] = []
    hold, reading = asyncio.Event(), asyncio.Event()
    hold.set()
    routes = Routes("test")

    @routes.add("POST", "/read", roles=None, summary="reads a JSON body")
    async def handler(request: web.Request) -> web.Response:
        await read_json_body(request, 16 * MIB)
        seen.append([(names[id(b)], size) for b, size in request[BODY_RESERVED]])
        reading.set()
        await hold.wait()
        return web.json_response({})

    install(app, routes)
    service = await serve(app, "t")
    try:
        yield Served(service, budgets, seen, hold, reading)
    finally:
        await service.close()


async def post(served: Served, body: bytes, *, chunked: bool = False) -> aiohttp.ClientResponse:
    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 4096):
            yield body[start : start + 4096]

    data = pieces() if chunked else body
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{served.service.url}/read", data=data) as response,
    ):
        await response.read()
        return response


def values(body: bytes) -> int:
    """The quick count of JSON values the budget estimates with (evora.http.bodies)."""
    return sum(body.count(c) for c in (b",", b":", b"[", b"{")) + 1


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_body_reserves_its_bytes_and_its_parsing_and_gives_them_back(
    served: Served, chunked: bool
) -> None:
    items = [{"queue": "q", "type": "t", "payload": {"n": n}} for n in range(500)]
    body = orjson.dumps({"jobs": items})
    assert (await post(served, body, chunked=chunked)).status == 200
    (reserved,) = served.seen
    read = sum(size for name, size in reserved if name == "bodies")
    assert read == len(body)  # declared up front, or piece by piece: the same bytes
    assert [size for name, size in reserved if name == "parsing"] == [
        len(body) + PARSED_VALUE * values(body)
    ]
    assert served.budgets.bodies.held == served.budgets.parsing.held == 0


async def test_the_parsing_estimate_of_a_body_of_nested_lists_is_the_whole_parsing_budget(
    served: Served,
) -> None:
    body = b'{"payload": [' + b",".join([b"[[]]"] * 300_000) + b"]}"  # ~1.5 MiB, 1.2M values
    assert (await post(served, body)).status == 200
    parsing = [size for name, size in served.seen[0] if name == "parsing"]
    assert parsing == [served.budgets.parsing.capacity]


async def test_a_request_that_finds_no_room_waits_then_is_answered_503(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bodies, "BODY_BUDGET_WAIT_S", 0.3)
    nested = b'{"payload": [' + b",".join([b"[[]]"] * 300_000) + b"]}"  # all the parsing room
    served.hold.clear()
    first = asyncio.create_task(post(served, nested))
    await asyncio.wait_for(served.reading.wait(), 10)
    refused = await post(served, b'{"small": true}')
    assert refused.status == 503
    assert refused.headers["Retry-After"] == "1"
    assert refused.content_type == "application/problem+json"
    # The one that waited holds nothing; the first is answered as usual once let go.
    served.hold.set()
    assert (await first).status == 200
    assert served.budgets.bodies.held == served.budgets.parsing.held == 0


async def test_a_waiting_request_is_admitted_when_room_comes_back(served: Served) -> None:
    nested = b'{"payload": [' + b",".join([b"[[]]"] * 300_000) + b"]}"
    served.hold.clear()
    first = asyncio.create_task(post(served, nested))
    await asyncio.wait_for(served.reading.wait(), 10)
    second = asyncio.create_task(post(served, b'{"small": true}'))
    await until(lambda: served.budgets.parsing.waiting == 1, "the second request in line")
    assert not second.done()
    served.hold.set()
    assert [(await first).status, (await second).status] == [200, 200]
