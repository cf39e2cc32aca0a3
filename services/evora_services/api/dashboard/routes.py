"""`GET /` and `GET /dashboard/{file}`: the dashboard's files, public (the page itself
holds no data; it asks for an admin token and sends it on every api call).

Files are looked up by exact name in a table built from the package's `static/` folder,
never by joining a request path onto a directory, so no path can reach anything else.
Every answer carries a strict Content-Security-Policy: scripts and styles only from this
origin, no inline code, no eval, and Trusted Types enforced so that assigning a string to
`innerHTML` and its kin throws in the browser.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from importlib import resources

from aiohttp import web

from evora.http.problems import Problem
from evora.http.routing import Routes

dashboard = Routes("dashboard")

INDEX = "index.html"
ASSET_PREFIX = "/dashboard/"

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "font-src 'none'",
        "object-src 'none'",
        "media-src 'none'",
        "frame-src 'none'",
        "worker-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    ]
)

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}

# Files keep their names across releases (there is no build step to fingerprint them), so
# browsers must revalidate each time; the ETag makes that a cheap 304.
CACHE_CONTROL = "no-cache"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    content_type: str
    etag: str


@functools.cache
def static_files() -> dict[str, StaticFile]:
    """Name -> file, for every file of `static/` with a known content type."""
    folder = resources.files(__package__ or "evora_services.api.dashboard") / "static"
    table = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if not entry.is_file() or suffix not in CONTENT_TYPES:
            continue
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        table[entry.name] = StaticFile(body, CONTENT_TYPES[suffix], etag)
    return table


def _serve(request: web.Request, name: str) -> web.Response:
    found = static_files().get(name)
    if found is None:
        raise Problem(404, "not_found", "Not found", "no such dashboard file")
    headers = {**SECURITY_HEADERS, "Cache-Control": CACHE_CONTROL, "ETag": found.etag}
    if found.etag in _etags(request.headers.get("If-None-Match", "")):
        return web.Response(status=304, headers=headers)
    response = web.Response(body=found.body, headers=headers)
    response.headers["Content-Type"] = found.content_type
    return response


def _etags(header: str) -> set[str]:
    return {tag.strip().removeprefix("W/") for tag in header.split(",") if tag.strip()}


@dashboard.add(
    "GET",
    "/",
    roles=None,
    summary="The admin dashboard (sign in with an admin token in the page).",
    responses={200: None, 304: None},
    problems=(404,),
    content_type="text/html",
)
async def index(request: web.Request) -> web.Response:
    return _serve(request, INDEX)


@dashboard.add(
    "GET",
    ASSET_PREFIX + "{file}",
    roles=None,
    summary="A static file of the dashboard (scripts, styles, icons).",
    responses={200: None, 304: None},
    problems=(404,),
    content_type=tuple(sorted(set(CONTENT_TYPES.values()) - {CONTENT_TYPES[".html"]})),
)
async def asset(request: web.Request) -> web.Response:
    name = request.match_info["file"]
    if name == INDEX:  # one address for the page, so its policy and caching are one
        raise Problem(404, "not_found", "Not found", "no such dashboard file")
    return _serve(request, name)
