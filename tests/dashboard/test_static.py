"""The dashboard's static route, over HTTP without a browser: content types, caching,
security headers, 404s and no way out of the static folder."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from evora.config import Settings
from evora.http.problems import PROBLEM_CONTENT_TYPE
from evora_services.api.app import create_app
from evora_services.api.dashboard.routes import CONTENT_SECURITY_POLICY, static_files

REPO = Path(__file__).resolve().parents[2]
STATIC = REPO / "services" / "evora_services" / "api" / "dashboard" / "static"

Client = TestClient[web.Request, web.Application]


@pytest.fixture(scope="module")
async def client() -> AsyncIterator[Client]:
    # The real api app with auth on; the pool opens lazily, so no database is needed here.
    settings = Settings(
        database_url="postgresql://x@127.0.0.1:1/x", tokens="admin:test-admin-token"
    )
    client: Client = TestClient(TestServer(await create_app(settings)))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


def directives(policy: str) -> dict[str, str]:
    return {
        name: value.strip()
        for name, _, value in (d.strip().partition(" ") for d in policy.split(";"))
    }


async def test_the_page_is_public_html_with_a_strict_policy(client: Client) -> None:
    response = await client.get("/")  # no token: the page asks for one
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    body = await response.text()
    assert "<title>Evora dashboard</title>" in body
    # Where a developer finds the token to sign in with.
    assert "<code>.evora/env</code> as <code>EVORA_ADMIN_TOKEN</code>" in body
    policy = directives(response.headers["Content-Security-Policy"])
    assert policy["default-src"] == "'self'"
    assert policy["script-src"] == "'self'"
    assert policy["style-src"] == "'self'"
    assert policy["object-src"] == "'none'"
    assert policy["base-uri"] == "'none'"
    assert policy["frame-ancestors"] == "'none'"
    assert policy["require-trusted-types-for"] == "'script'"
    assert "unsafe" not in CONTENT_SECURITY_POLICY
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Referrer-Policy"] == "no-referrer"
    assert response.headers["Cache-Control"] == "no-cache"
    assert "Set-Cookie" not in response.headers


@pytest.mark.parametrize(
    ("name", "content_type"),
    [
        ("app.js", "text/javascript; charset=utf-8"),
        ("dom.js", "text/javascript; charset=utf-8"),
        ("style.css", "text/css; charset=utf-8"),
        ("favicon.svg", "image/svg+xml"),
    ],
)
async def test_files_have_their_content_type_and_headers(
    client: Client, name: str, content_type: str
) -> None:
    response = await client.get(f"/dashboard/{name}")
    assert response.status == 200
    assert response.headers["Content-Type"] == content_type
    assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert await response.read() == (STATIC / name).read_bytes()


async def test_every_shipped_file_is_served() -> None:
    shipped = {p.name for p in STATIC.iterdir() if p.is_file()}
    assert set(static_files()) == shipped
    assert {"index.html", "app.js", "style.css"} <= shipped


async def test_unchanged_files_revalidate_with_an_etag(client: Client) -> None:
    first = await client.get("/dashboard/app.js")
    etag = first.headers["ETag"]
    assert first.headers["Cache-Control"] == "no-cache"
    again = await client.get("/dashboard/app.js", headers={"If-None-Match": etag})
    assert again.status == 304
    assert await again.read() == b""
    assert again.headers["ETag"] == etag
    weak = await client.get("/dashboard/app.js", headers={"If-None-Match": f'"x", W/{etag}'})
    assert weak.status == 304
    other = await client.get("/dashboard/app.js", headers={"If-None-Match": '"nope"'})
    assert other.status == 200


@pytest.mark.parametrize(
    "path",
    [
        "/dashboard/nothing.js",
        "/dashboard/",
        "/dashboard",
        "/dashboard/index.html",  # the page has one address: /
        "/dashboard/APP.JS",
        "/dashboard/app.js.map",
        "/dashboard/__init__.py",
        "/dashboard/routes.py",
        "/dashboard/static",
        "/dashboard/static%2Fapp.js",
        "/dashboard/..%2Froutes.py",
        "/dashboard/..%2F..%2F..%2F..%2Fpyproject.toml",
        "/dashboard/%2e%2e%2f%2e%2e%2fapp.py",
        "/dashboard/..%5c..%5capp.py",
        "/dashboard/%2Fetc%2Fpasswd",
        "/dashboard/....%2F%2Fetc%2Fpasswd",
        "/dashboard/app.js%00.css",
        "/dashboard/../app.py",
        "/dashboard/./app.js/..",
        "/dashboard/../../../../etc/passwd",
        "/dashboard//etc/passwd",
    ],
)
async def test_unknown_files_and_traversal_are_404(client: Client, path: str) -> None:
    # encoded=True: sent exactly as written, not normalised by the client
    response = await client.session.get(client.make_url("").join(URL(path, encoded=True)))
    assert response.status == 404, path
    assert response.content_type == PROBLEM_CONTENT_TYPE
    body = await response.read()
    assert b"root:" not in body and b"[project]" not in body and b"import" not in body


async def test_other_methods_are_refused(client: Client) -> None:
    assert (await client.post("/", data=b"x")).status == 405
    assert (await client.put("/dashboard/app.js", data=b"x")).status == 405


async def test_openapi_lists_the_dashboard_as_public(client: Client) -> None:
    document = await (await client.get("/openapi.json")).json()
    for path in ("/", "/dashboard/{file}"):
        operation = document["paths"][path]["get"]
        assert "security" not in operation


# -- the scripts themselves --------------------------------------------------------------

UNSAFE_SINKS = re.compile(
    r"\.(innerHTML|outerHTML)\s*=|insertAdjacentHTML|document\.write|\beval\s*\(|"
    r"new\s+Function\s*\(|setTimeout\s*\(\s*['\"`]|setInterval\s*\(\s*['\"`]|"
    r"createContextualFragment|DOMParser|\.srcdoc\s*="
)


@pytest.mark.parametrize("name", sorted(p.name for p in STATIC.glob("*.js")))
def test_scripts_use_no_html_sinks(name: str) -> None:
    source = (STATIC / name).read_text()
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("//"))
    assert not UNSAFE_SINKS.search(code), UNSAFE_SINKS.search(code)


def test_the_page_loads_nothing_from_elsewhere() -> None:
    for path in STATIC.iterdir():
        text = path.read_text()
        # no scheme-relative or absolute URLs to other hosts (the SVG namespace aside)
        found = re.findall(r"(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}[^\s\"')]*", text)
        assert [u for u in found if u != "http://www.w3.org/2000/svg"] == [], path.name
    index = (STATIC / "index.html").read_text()
    assert "<style" not in index and " style=" not in index
    assert re.findall(r"<script[^>]*>", index) == ['<script type="module" src="/dashboard/app.js">']
    assert not re.search(r"\son[a-z]+\s*=", index)  # no inline event handlers
