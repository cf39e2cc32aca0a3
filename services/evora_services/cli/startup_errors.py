"""One line that says what to do, instead of a traceback, for the ways a command commonly
fails to start: a port in use, a database that cannot be reached, does not exist, refuses
the credentials, or sits behind a pooler the settings do not name. `explain` recognises
them; anything else is left to propagate."""

from __future__ import annotations

import errno
import re
import socket
from collections.abc import Iterator, Mapping
from urllib.parse import parse_qs, unquote, urlsplit

import asyncpg

from evora.config import Settings
from evora.embedded import EmbeddedServerError


class StartupError(Exception):
    """A command cannot start; the message is one line that says what to do."""


# How uvloop and asyncio name the address a bind failed on: "... on address ('::', 8080)".
_BIND_ADDRESS = re.compile(r"\('?([^',]*)'?, (\d+)\)")


def port_variables(settings: Settings) -> Mapping[int, str]:
    """Each listening port in use by `settings` -> the variable that sets it."""
    return {
        settings.api_port: "EVORA_API_PORT",
        settings.dispatcher_port: "EVORA_DISPATCHER_PORT",
        settings.sweeper_port: "EVORA_SWEEPER_PORT",
        settings.projector_port: "EVORA_PROJECTOR_PORT",
    }


def port_in_use(host: str, port: int, variable: str | None) -> str:
    setting = f" ({variable})" if variable else ""
    fix = f"choose another with {variable}" if variable else "choose another port"
    return (
        f"port {port} on {host or '*'}{setting} is already in use: stop what listens there or {fix}"
    )


def database_target(url: str) -> str:
    """Where a postgresql:// URL points, without its credentials: host:port/database, or
    the socket directory for `?host=/path`."""
    parts = urlsplit(url)
    query_host = parse_qs(parts.query).get("host", [""])[0]
    host = unquote(query_host) or parts.hostname or "localhost"
    port = parts.port or 5432
    database = unquote(parts.path.lstrip("/")) or parts.username or "postgres"
    place = f"socket directory {host}" if host.startswith("/") else f"{host}:{port}"
    return f"{place}, database {database!r}"


# Messages of connection failures that carry no errno: asyncio's when several addresses all
# failed, and a Unix socket's path that does not exist (PostgreSQL's socket files are named so).
_UNREACHABLE_SIGNS = ("Connect call failed", ".s.PGSQL.")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, its causes and contexts, and the members of exception groups among them."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)


def _database_problem(exc: BaseException, url: str) -> str | None:
    where = database_target(url)
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return (
            f"the database does not exist ({where}): create it (createdb, or CREATE DATABASE) "
            "or correct EVORA_DATABASE_URL"
        )
    if isinstance(
        exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError
    ):
        return f"PostgreSQL refused the credentials ({where}): correct EVORA_DATABASE_URL"
    if isinstance(exc, asyncpg.ProtocolViolationError) and "startup parameter" in str(exc):
        # A stock PgBouncer: it takes no session settings at connect time (docs/deploy.md).
        return (
            f"a connection pooler in front of PostgreSQL ({where}) refused the connection "
            f"({exc}): set EVORA_DATABASE_POOLER to its pool mode, session or transaction"
        )
    if isinstance(exc, ConnectionError) and "rejected SSL upgrade" in str(exc):
        return (
            f"PostgreSQL does not offer TLS ({where}) but the URL's sslmode requires it: "
            "enable TLS on the server or choose another sslmode in EVORA_DATABASE_URL"
        )
    unreachable = isinstance(exc, asyncpg.CannotConnectNowError | socket.gaierror | TimeoutError)
    if isinstance(exc, OSError) and not unreachable:
        unreachable = exc.errno in {
            errno.ECONNREFUSED,
            errno.EHOSTUNREACH,
            errno.ENETUNREACH,
            errno.ETIMEDOUT,
        } or any(sign in str(exc) for sign in _UNREACHABLE_SIGNS)
    if unreachable:
        reason = str(exc).strip() or type(exc).__name__
        return (
            f"cannot reach PostgreSQL ({where}): {reason}; start it or correct EVORA_DATABASE_URL"
        )
    return None


def explain(exc: BaseException, settings: Settings) -> str | None:
    """One line for a failure to start that has a known cause, else None."""
    for found in _chain(exc):
        if isinstance(found, StartupError | EmbeddedServerError):
            return str(found)
        if isinstance(found, OSError) and found.errno == errno.EADDRINUSE:
            match = _BIND_ADDRESS.search(str(found))
            if match:
                port = int(match.group(2))
                return port_in_use(match.group(1), port, port_variables(settings).get(port))
            return f"an address is already in use: {found}"
        if settings.database_url is not None:
            problem = _database_problem(found, settings.database_url)
            if problem is not None:
                return problem
    return None
