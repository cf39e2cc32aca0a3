"""The `evora` command, the composition root: it builds and runs the services (this package
also holds `evora dev`, `evora doctor` and the operator commands). Services need the `server`
extra; `evora worker` runs on the SDK alone (a worker's `pip install evora-queue`), so it
reads its few settings without the services' configuration class."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, get_args

from evora.logs import LogFormat, configure_logging
from evora_services.cli.admin.parser import add_commands

if TYPE_CHECKING:
    from evora.config import Settings
    from evora.storage.db import Pooler

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

log = logging.getLogger("evora")


# asyncio (which imports ssl) and importlib.metadata are imported by the commands that use
# them: every `evora` start pays for what this module imports, `evora --help` included.


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from evora.storage.migrate import apply_migrations

    settings.require("database_url", serving=False)
    dsn, pooler = settings.require_session_database("`evora migrate` (its advisory lock)")
    if args.check:
        return asyncio.run(_check_drift(dsn, pooler))
    applied = asyncio.run(
        apply_migrations(
            dsn,
            pooler=pooler,
            event_partition_seconds=settings.event_partition_seconds,
            event_partitions_ahead=settings.event_partitions_ahead,
        )
    )
    if applied:
        print(f"applied migrations: {', '.join(f'{v:04d}' for v in applied)}")
    else:
        print("database is up to date")
    return 0


# `evora migrate --check` found the database differing from the code
DRIFT = 3


async def _check_drift(dsn: str, pooler: Pooler) -> int:
    from evora.storage.db import connect
    from evora.storage.drift import drift

    conn = await connect(dsn, application_name="evora-migrate-check", pooler=pooler)
    try:
        found = await drift(conn)
    finally:
        await conn.close()
    for difference in found:
        print(difference)
    if not found:
        print("the database is what this code's migrations and function files build")
    return DRIFT if found else 0


# `evora audit` found a violation (0: none; 1 and 2 as every command: it could not run)
AUDIT_VIOLATIONS = 3
_SPAN_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _seconds(text: str, *, unit_required: bool) -> float | None:
    """A number of seconds from `90`, `90s`, `15m`, `1h` or `7d`; None if it is none (or
    negative, or not finite)."""
    unit = text[-1:].lower()
    if unit in _SPAN_UNITS:
        text, scale = text[:-1], _SPAN_UNITS[unit]
    elif unit_required:
        return None
    else:
        scale = 1
    try:
        value = float(text)
    except ValueError:
        return None
    return value * scale if 0 <= value < float("inf") else None


def _span(text: str) -> timedelta:
    """`--since`: a number and a unit, s, m, h or d (`90s`, `15m`, `1h`, `7d`)."""
    seconds = _seconds(text, unit_required=True)
    if not seconds:
        raise argparse.ArgumentTypeError(f"{text!r} is not a span such as 90s, 15m, 1h or 7d")
    return timedelta(seconds=seconds)


def _duration(text: str) -> float:
    """`--older-than`: seconds, or a number and a unit (`0s`, `90s`, `1h`, `30d`)."""
    seconds = _seconds(text, unit_required=False)
    if seconds is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 0s, 90s, 1h or 30d")
    return seconds


def _audit(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from evora.storage.audit import audit

    settings.require("database_url", serving=False)
    assert settings.database_url is not None
    report = asyncio.run(audit(settings.database_url, args.since))
    print(report.dumps() if args.json else report.text())
    return 0 if report.ok else AUDIT_VIOLATIONS


def _doctor(args: argparse.Namespace, settings: Settings) -> int:
    from evora_services.cli.doctor import main

    return main(args, settings)


def _dev(args: argparse.Namespace, settings: Settings) -> int:
    from evora_services.cli.dev import run_dev

    return run_dev(settings)


def _api(args: argparse.Namespace, settings: Settings) -> int:
    from evora_services.api.main import run

    return run(settings)


def _dispatcher(args: argparse.Namespace, settings: Settings) -> int:
    from evora_services.dispatcher.main import run

    return run(settings)


def _projector(args: argparse.Namespace, settings: Settings) -> int:
    from evora_services.projector.main import run, run_rebuild

    return run_rebuild(settings) if args.rebuild else run(settings)


def _sweeper(args: argparse.Namespace, settings: Settings) -> int:
    from evora_services.sweeper.main import run

    return run(settings)


def _dispatcher_url(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """--url, else EVORA_DISPATCHER_URL, else the dispatcher of this machine on
    EVORA_DISPATCHER_PORT (what `evora dispatcher` listens on), else the module's own."""
    from evora.sdk.loading import ENV_DISPATCHER_URL

    if args.url or environ.get(ENV_DISPATCHER_URL):
        return str(args.url or environ[ENV_DISPATCHER_URL])
    port = environ.get("EVORA_DISPATCHER_PORT", "").strip()
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError("EVORA_DISPATCHER_PORT must be a port number (1-65535)")
    return f"http://127.0.0.1:{port}" if port else None


def _worker(args: argparse.Namespace, url: str | None) -> int:
    from evora.sdk.loading import run_worker_from_module

    queues = [q.strip() for q in args.queues.split(",") if q.strip()] if args.queues else None
    return run_worker_from_module(
        args.module,
        url=url,
        token=args.token,
        queues=queues,
        concurrency=args.concurrency,
        prefetch=args.prefetch,
    )


def _pipeline(args: argparse.Namespace, settings: Settings) -> int:
    from evora_services.cli.dev import with_dev_urls
    from evora_services.pipeline.main import run_command

    return run_command(args, with_dev_urls(settings))


Command = Callable[[argparse.Namespace, "Settings"], int]


_PIPELINE_ENV = (
    "EVORA_DATABASE_URL (required; unset: that of the evora dev running on EVORA_DATA_DIR, "
    "from its env file), EVORA_ARCHIVE_URL, EVORA_JDBC_JAR, EVORA_LOG_LEVEL; see "
    "services/evora_services/pipeline/README.md"
)


def _add_pipeline(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pipeline = sub.add_parser(
        "pipeline",
        help="the PySpark batch pipeline: Parquet event archive and analytics",
        description="The PySpark batch pipeline: Spark jobs over the event history.",
        epilog=f"environment: {_PIPELINE_ENV}",
    )
    jobs = pipeline.add_subparsers(dest="pipeline_command", required=True, metavar="JOB")
    archive = _command(
        jobs,
        "archive",
        "copy old, projected events to the Parquet archive (EVORA_ARCHIVE_URL), verify, "
        "then let the sweeper remove them from PostgreSQL",
        "Idempotent: a run that stopped half-way is completed by the next.",
        _PIPELINE_ENV,
    )
    archive.add_argument(
        "--older-than",
        type=_duration,
        metavar="DURATION",
        help="archive events older than this: seconds, or 0s, 90s, 1h, 30d (default "
        "EVORA_RETENTION_EVENTS_SECONDS, 30 days); on a dev stack, 0s archives every event "
        "already projected",
    )
    archive.add_argument("--max-events", type=int, help="archive at most this many per run")
    run = _command(
        jobs,
        "run",
        "analytics per queue and job type over archive plus live events, "
        "to Parquet and MongoDB (analytics_*)",
        "Reads PostgreSQL through JDBC.",
        f"EVORA_MONGO_URL, EVORA_MONGO_DB, {_PIPELINE_ENV}",
    )
    run.add_argument("--output", help="Parquet output URL (default EVORA_ARCHIVE_URL/analytics)")
    run.add_argument("--no-mongo", action="store_true", help="write Parquet only")
    run.add_argument("--top-reasons", type=int, default=5, help="failure reasons kept per type")
    for job in (archive, run):
        job.add_argument(
            "--master", help="Spark master URL (default: spark-submit's, else local[*])"
        )
        job.add_argument("--archive-url", help="archive location (default EVORA_ARCHIVE_URL)")
        job.add_argument(
            "--jdbc-jar",
            help="pgjdbc jar (default EVORA_JDBC_JAR or /usr/share/java/postgresql.jar)",
        )
        job.add_argument(
            "--jdbc-partitions", type=int, default=4, help="concurrent JDBC range reads"
        )
        job.add_argument("--conf", action="append", metavar="KEY=VALUE", help="extra Spark setting")
        job.add_argument(
            "--progress-every",
            type=float,
            default=10.0,
            metavar="SECONDS",
            help="how often to log Spark progress",
        )
    pipeline.set_defaults(run=_pipeline)


# The name pip installs (`import evora` stays): PyPI's `evora` is an unrelated project.
DISTRIBUTION = "evora-queue"


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


class _Version(argparse.Action):
    """argparse's `version` action with the version looked up when --version is given, not
    each time the parser is built."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="show program's version number and exit",
        )

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"evora {_version()}")  # on stdout, as argparse's own
        parser.exit()


_SERVICE_ENV = (
    "EVORA_DATABASE_URL (required), EVORA_TOKENS (role:token,...; required unless "
    "EVORA_AUTH=disabled), EVORA_HOST, EVORA_LOG_LEVEL, EVORA_LOG_FORMAT; all settings: "
    "docs/configuration.md"
)


def _command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    summary: str,
    description: str,
    environment: str | None = None,
) -> argparse.ArgumentParser:
    """A subcommand whose --help says what it does and what it reads."""
    return sub.add_parser(
        name,
        help=summary,
        description=f"{summary}. {description}",
        epilog=f"environment: {environment}" if environment else None,
    )


def _add_services(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _command(
        sub,
        "api",
        "producer and admin HTTP service, with the dashboard",
        "Serves /v1/jobs and /v1/queues (docs/http-api.md) and the dashboard at /; "
        "drains on SIGTERM.",
        f"EVORA_API_PORT (default 8080), {_SERVICE_ENV}",
    ).set_defaults(run=_api)
    _command(
        sub,
        "dispatcher",
        "worker-facing HTTP service with long-poll claims",
        "Workers claim jobs here, heartbeat, and report outcomes; drains on SIGTERM.",
        f"EVORA_DISPATCHER_PORT (default 8081), {_SERVICE_ENV}",
    ).set_defaults(run=_dispatcher)
    projector = _command(
        sub,
        "projector",
        "tail the job_events outbox into MongoDB read models",
        "Keeps the MongoDB read models (stats, the dashboard) up to date.",
        f"EVORA_MONGO_URL (required), EVORA_MONGO_DB, EVORA_PROJECTOR_PORT (default 8083), "
        f"{_SERVICE_ENV}",
    )
    projector.add_argument(
        "--rebuild",
        action="store_true",
        help="rebuild the read models from the whole outbox into a new generation, then switch",
    )
    projector.set_defaults(run=_projector)
    _command(
        sub,
        "sweeper",
        "lease and TTL expiry, retention",
        "Returns jobs of vanished workers, expires TTLs, removes old finished jobs; serves "
        "health and metrics.",
        f"EVORA_SWEEPER_PORT (default 8082), the retention settings, {_SERVICE_ENV}",
    ).set_defaults(run=_sweeper)
    migrate = _command(
        sub,
        "migrate",
        "apply database migrations",
        "Idempotent and safe to run concurrently; serves nothing, so it needs no tokens. "
        f"With --check it changes nothing and lists where the database differs from the code, "
        f"exit status {DRIFT} when it does.",
        "EVORA_DATABASE_URL (required)",
    )
    migrate.add_argument(
        "--check",
        action="store_true",
        help="report drift (migrations and function files not applied, edited or unknown; "
        "tables, columns, indexes, constraints, triggers, functions or types missing or "
        "unexpected) instead of migrating",
    )
    migrate.set_defaults(run=_migrate)
    audit = _command(
        sub,
        "audit",
        "check the system's invariants over the event history",
        "Reads the job events and tables and checks every invariant of docs/audit.md, listing "
        "the jobs and events that break one. Exit status 0 when none is broken, "
        f"{AUDIT_VIOLATIONS} when one is.",
        "EVORA_DATABASE_URL (required)",
    )
    audit.add_argument(
        "--since",
        type=_span,
        metavar="SPAN",
        help="only the events of the last SPAN (90s, 15m, 1h, 7d); default: the whole history",
    )
    audit.add_argument("--json", action="store_true", help="print the report as JSON")
    audit.set_defaults(run=_audit)

    doctor = _command(
        sub,
        "doctor",
        "check the database and the services as an operator would",
        "Connects as the services do and reports each check (PostgreSQL version, migrations, "
        "pooler and wake-ups, long transactions, dead tuples, projector lag, sweeper and "
        "projector leaders, clock skew) with a verdict and what to do; exits 1 when one fails.",
        "EVORA_DATABASE_URL (required), EVORA_DATABASE_POOLER, EVORA_DIRECT_DATABASE_URL",
    )
    doctor.add_argument("--json", action="store_true", help="one JSON object, for scripts")
    doctor.set_defaults(run=_doctor)
    _command(
        sub,
        "dev",
        "the whole system on this machine with embedded databases",
        "Starts PostgreSQL and a MongoDB-wire server under EVORA_DATA_DIR (unless "
        "EVORA_DATABASE_URL / EVORA_MONGO_URL are set), applies migrations and runs every "
        "service on loopback. A default port that is busy is replaced by a free one. Prints "
        "the URLs and tokens and writes them as export lines to EVORA_DATA_DIR/env.",
        "EVORA_DATA_DIR (default .evora), EVORA_API_PORT, EVORA_DISPATCHER_PORT, "
        "EVORA_DATABASE_URL, EVORA_MONGO_URL, EVORA_TOKENS",
    ).set_defaults(run=_dev, dev=True)


def _add_worker(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    worker = _command(
        sub,
        "worker",
        "run a worker with the handlers registered in MODULE",
        "MODULE holds an evora.Worker, or evora.Handlers registries that a new worker runs. "
        "Needs only the SDK (evora-queue without extras). SIGTERM or Ctrl-C: stop claiming, "
        "finish in-flight jobs, release the rest.",
        "EVORA_DISPATCHER_URL (else http://127.0.0.1:EVORA_DISPATCHER_PORT, default 8081), "
        "EVORA_WORKER_TOKEN, EVORA_WORKER_QUEUES, EVORA_WORKER_CONCURRENCY, "
        "EVORA_WORKER_PREFETCH, EVORA_LOG_LEVEL, "
        "EVORA_LOG_FORMAT",
    )
    worker.add_argument("module", metavar="MODULE", help="importable module, e.g. myapp.jobs")
    worker.add_argument("--url", help="dispatcher URL (EVORA_DISPATCHER_URL)")
    worker.add_argument("--token", help="worker token (EVORA_WORKER_TOKEN)")
    worker.add_argument("--queues", help="comma-separated queues (EVORA_WORKER_QUEUES)")
    worker.add_argument("--concurrency", type=int, help="jobs at once (EVORA_WORKER_CONCURRENCY)")
    worker.add_argument(
        "--prefetch",
        type=int,
        help="jobs held claimed beyond --concurrency, waiting for a slot (EVORA_WORKER_PREFETCH)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evora",
        description="Evora: a distributed job queue on PostgreSQL. "
        "`evora COMMAND --help` tells more about each command.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_services(sub)
    _add_worker(sub)
    _add_pipeline(sub)
    add_commands(sub)
    return parser


def _worker_tokens(args: argparse.Namespace) -> list[str]:
    """The token `evora worker` sends, to keep it out of its logs."""
    from evora.sdk.loading import ENV_WORKER_TOKEN

    return [token for token in (args.token, os.environ.get(ENV_WORKER_TOKEN)) if token]


def _default_log_format(dev: bool = False) -> LogFormat:
    """Without EVORA_LOG_FORMAT: readable lines for a person (stderr is a terminal, or
    `evora dev`), one JSON object per line for a log collector."""
    return "text" if dev or sys.stderr.isatty() else "json"


def _worker_logging(args: argparse.Namespace) -> None:
    level = os.environ.get("EVORA_LOG_LEVEL", "INFO").strip().upper() or "INFO"
    raw_format = os.environ.get("EVORA_LOG_FORMAT", "").strip().lower() or _default_log_format()
    if level not in LOG_LEVELS:
        raise ValueError(f"EVORA_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}")
    formats: tuple[LogFormat, ...] = get_args(LogFormat)
    fmt = next((f for f in formats if f == raw_format), None)
    if fmt is None:
        raise ValueError("EVORA_LOG_FORMAT must be json or text")
    configure_logging(level, fmt, service="worker", secrets=_worker_tokens(args))


def _tracing(command: str) -> None:
    """OpenTelemetry from the OTEL_* environment, when it asks for tracing (imported only
    then); ValueError for a setting it cannot honour."""
    from evora.tracing import configure

    configure(command, os.environ)


def _services_main(args: argparse.Namespace) -> int:
    from evora.config import LOOPBACK, ConfigError, check_environment, load_settings
    from evora_services.cli.startup_errors import explain

    dev = getattr(args, "dev", False)
    try:
        warnings = check_environment(os.environ)
        # `evora dev` is on this machine for its user only: the published example tokens
        # are allowed there.
        settings = load_settings(**({"allow_example_tokens": True} if dev else {}))
    except ConfigError as exc:
        print(f"evora: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if dev and "EVORA_HOST" not in os.environ:
        # `evora dev` stays on this machine unless told otherwise.
        settings = settings.model_copy(update={"host": LOOPBACK})
    configure_logging(
        settings.log_level,
        settings.log_format or _default_log_format(dev),
        service=args.command,
        secrets=settings.token_roles(),
    )
    for warning in warnings:
        log.warning(warning)
    run: Command = args.run
    try:
        _tracing(args.command)
    except ValueError as exc:
        print(f"evora: invalid configuration: {exc}", file=sys.stderr)
        return 2
    try:
        return run(args, settings)
    except ConfigError as exc:
        print(f"evora: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        line = explain(exc, settings)
        if line is None:
            raise
        print(f"evora {args.command}: {line}", file=sys.stderr)
        return 1


# What the services import beyond the SDK, all brought by the `server` extra: an SDK-only
# install (a worker's) says which extra to install instead of failing on an import.
_SERVER_MODULES = ("asyncpg", "pymongo", "pydantic_settings", "prometheus_client")


def _server_extra_missing(command: str) -> str | None:
    """The one line that says so, when the services' dependencies are not installed."""
    missing = [m for m in _SERVER_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (
        f"evora {command}: needs the server extra ({', '.join(missing)} missing): install "
        f"'{DISTRIBUTION}[server]' (from a clone: pip install '.[server]', or "
        "bash scripts/run.sh for evora dev); the SDK alone runs only evora worker and the "
        "operator commands (jobs, queues, dlq)"
    )


# Options whose value is an opaque secret, which may begin with "-" (a token made by
# `secrets.token_urlsafe` does one time in 64): argparse reads `--token -abc` as an option
# with no value. Passed on as `--token=-abc`, the value is taken whatever it holds.
_SECRET_OPTIONS = frozenset({"--token"})


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    given = iter(argv)
    joined: list[str] = []
    for arg in given:
        if arg == "--":  # the rest is positional
            joined += [arg, *given]
        elif arg in _SECRET_OPTIONS and (value := next(given, None)) is not None:
            joined.append(f"{arg}={value}")
        else:
            joined.append(arg)
    return _parser().parse_args(joined)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if hasattr(args, "operate"):  # the operator commands: the SDK alone, no logging set up
        from evora_services.cli.admin.run import run

        return run(args)
    if args.command == "worker":
        try:
            _worker_logging(args)
            url = _dispatcher_url(args, os.environ)
            _tracing("worker")
        except ValueError as exc:
            print(f"evora: invalid configuration: {exc}", file=sys.stderr)
            return 2
        try:
            return _worker(args, url)
        except KeyboardInterrupt:
            return 130
    if (line := _server_extra_missing(args.command)) is not None:
        print(line, file=sys.stderr)
        return 2
    return _services_main(args)
