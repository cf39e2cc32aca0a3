"""Resolving callbacks (docs/callbacks.md): by a webhook sender, whose credential is the
callback id itself, and by an admin, by the job that waits (the dashboard's approval)."""

from __future__ import annotations

import re
from uuid import UUID

from aiohttp import web

from evora.domain.errors import CallbackNotFound
from evora.http.app import SETTINGS
from evora.http.bodies import parse_body
from evora.http.jsonio import json_response
from evora.http.routing import Routes
from evora.protocol.callbacks import CallbackResolution, ResolveCallbackRequest
from evora_services.api.paths import job_id
from evora_services.api.routes import ADMIN, STORE, submission_body_limit

# Every endpoint here uses the database: 503 when it is unavailable.
callbacks = Routes("callbacks", path={"id": UUID}, problems=(503,))

# A callback id is `evcb_` and 64 hex digits: anything else (longer, or with a character
# PostgreSQL's text cannot hold, such as NUL) is no callback, answered without a query.
_CALLBACK_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


@callbacks.add(
    "POST",
    "/v1/callbacks/{callback_id}",
    roles=None,
    summary=(
        "Resolve a callback: the job suspended on it becomes PENDING and its next attempt "
        "sees the payload. The callback id is the credential (no token). A repeat answers the "
        "first resolution; after the timeout, or once the job was cancelled, 409."
    ),
    body=ResolveCallbackRequest,
    responses={200: CallbackResolution},
    problems=(404, 409),
)
async def resolve(request: web.Request) -> web.Response:
    callback_id = request.match_info["callback_id"]
    if _CALLBACK_ID.fullmatch(callback_id) is None:
        raise CallbackNotFound("no such callback")
    body = await parse_body(
        request, ResolveCallbackRequest, limit=submission_body_limit(request.app[SETTINGS])
    )
    return json_response(await request.app[STORE].resolve_callback(callback_id, body.payload))


@callbacks.add(
    "POST",
    "/v1/jobs/{id}/resolve",
    roles=ADMIN,
    summary=(
        "Resolve the callback the SUSPENDED job waits on, as its sender would (a person's "
        "approval on the dashboard). 409 if the job waits on none."
    ),
    body=ResolveCallbackRequest,
    responses={200: CallbackResolution},
    problems=(404, 409),
)
async def resolve_job(request: web.Request) -> web.Response:
    body = await parse_body(
        request, ResolveCallbackRequest, limit=submission_body_limit(request.app[SETTINGS])
    )
    resolution = await request.app[STORE].resolve_callback(
        None, body.payload, job_id=job_id(request)
    )
    return json_response(resolution)
