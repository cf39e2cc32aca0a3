"""Bearer-token authentication with three roles (docs/http-api.md#authentication).

`admin` may call everything, `producer` the producer endpoints, `worker` the dispatcher's.
Missing or unknown token: 401; a valid token whose role may not call the endpoint: 403.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from evora.config import Role
from evora.http.problems import forbidden, unauthorized
from evora.http.routing import Endpoint

ROLE = web.RequestKey("role", str)


class TokenTable:
    """Known tokens and their roles; `None` means authentication is disabled."""

    def __init__(self, roles: dict[str, Role] | None) -> None:
        self.enabled = roles is not None
        self._roles = [(_raw(token), role) for token, role in (roles or {}).items()]

    def role_of(self, token: str) -> Role | None:
        # Compare against every token in constant time, so response timing tells nothing
        # about how much of a guess was right.
        found: Role | None = None
        guess = _raw(token)
        for known, role in self._roles:
            if hmac.compare_digest(known, guess):
                found = role
        return found


def _raw(text: str) -> bytes:
    # Header values are decoded as UTF-8 with surrogateescape, so bytes that are not UTF-8
    # arrive as lone surrogates; this turns them back into the bytes the client sent.
    return text.encode("utf-8", "surrogateescape")


def authorize(request: web.Request, endpoint: Endpoint, tokens: TokenTable) -> None:
    """Raise 401/403 unless the request may call `endpoint`."""
    if endpoint.roles is None or not tokens.enabled:
        return
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorized("send Authorization: Bearer <token>")
    role = tokens.role_of(token.strip())
    if role is None:
        raise unauthorized("unknown token")
    if role != "admin" and role not in endpoint.roles:
        raise forbidden(f"the {role} role may not call {endpoint.method} {endpoint.path}")
    request[ROLE] = role
