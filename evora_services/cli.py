"""The `evora` command. Services need the `server` extra; `evora worker` runs on the SDK
alone (a worker's `pip install evora`), so it reads its few settings without the services'
configuration class."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, get_args

from evora.logs import LogFormat, configure_logging

if TYPE_CHECKING:
    from evora.config import Settings

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    from evora.storage.migrate import apply_migrations

    settings.require("database_url")
    assert settings.database_url is not None
    applied = asyncio.run(apply_migrations(settings.database_url))
    if applied:
        print(f"applied migrations: {', '.join(f'{v:04d}' for v in applied)}")
    else:
        print("database is up to date")
    return 0


def _dev(args: argparse.Namespace, settings: Settings) -> int:
    from evora_services.dev import run_dev

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


def _worker(args: argparse.Namespace) -> int:
    from evora.sdk.loading import run_worker_from_module

    queues = [q.strip() for q in args.queues.split(",") if q.strip()] if args.queues else None
    return run_worker_from_module(
        args.module,
        url=args.url,
        token=args.token,
        queues=queues,
        concurrency=args.concurrency,
    )


def _pipeline(args: argparse.Namespace, settings: Settings) -> int:
    from evora_services.pipeline.main import run_command

    return run_command(args, settings)


Command = Callable[[argparse.Namespace, "Settings"], int]


def _add_pipeline(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pipeline = sub.add_parser(
        "pipeline",
        help="the PySpark batch pipeline: Parquet event archive and analytics",
        description="Spark jobs over the event history; see evora_services/pipeline/README.md.",
    )
    jobs = pipeline.add_subparsers(dest="pipeline_command", required=True, metavar="JOB")
    archive = jobs.add_parser(
        "archive",
        help="copy old, projected events to the Parquet archive (EVORA_ARCHIVE_URL), verify, "
        "then let the sweeper remove them from PostgreSQL",
    )
    archive.add_argument(
        "--older-than",
        type=float,
        metavar="SECONDS",
        help="archive events older than this (default EVORA_RETENTION_EVENTS_SECONDS)",
    )
    archive.add_argument("--max-events", type=int, help="archive at most this many per run")
    run = jobs.add_parser(
        "run",
        help="analytics per queue and job type over archive plus live events, "
        "to Parquet and MongoDB (analytics_*)",
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evora", description="Evora: a distributed job queue on PostgreSQL."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser(
        "api", help="producer and admin HTTP service (EVORA_API_PORT, default 8080)"
    ).set_defaults(run=_api)
    sub.add_parser(
        "dispatcher",
        help="worker-facing HTTP service with long-poll claims (EVORA_DISPATCHER_PORT, 8081)",
    ).set_defaults(run=_dispatcher)
    projector = sub.add_parser(
        "projector",
        help="tail the job_events outbox into MongoDB read models (EVORA_PROJECTOR_PORT, 8083)",
    )
    projector.add_argument(
        "--rebuild",
        action="store_true",
        help="rebuild the read models from the whole outbox into a new generation, then switch",
    )
    projector.set_defaults(run=_projector)
    sub.add_parser(
        "sweeper",
        help="lease and TTL expiry, retention; health and metrics (EVORA_SWEEPER_PORT, 8082)",
    ).set_defaults(run=_sweeper)
    sub.add_parser(
        "migrate", help="apply database migrations (idempotent, safe to run concurrently)"
    ).set_defaults(run=_migrate)
    dev = sub.add_parser(
        "dev", help="the whole system on this machine with embedded databases (EVORA_DATA_DIR)"
    )
    dev.set_defaults(run=_dev, dev=True)
    worker = sub.add_parser("worker", help="run a worker with the handlers registered in MODULE")
    worker.add_argument("module", metavar="MODULE", help="importable module, e.g. myapp.jobs")
    worker.add_argument("--url", help="dispatcher URL (EVORA_DISPATCHER_URL)")
    worker.add_argument("--token", help="worker token (EVORA_WORKER_TOKEN)")
    worker.add_argument("--queues", help="comma-separated queues (EVORA_WORKER_QUEUES)")
    worker.add_argument("--concurrency", type=int, help="jobs at once (EVORA_WORKER_CONCURRENCY)")
    worker.set_defaults(run=_worker)
    _add_pipeline(sub)
    return parser


def _worker_tokens(args: argparse.Namespace) -> list[str]:
    """The token `evora worker` sends, to keep it out of its logs."""
    from evora.sdk.loading import ENV_WORKER_TOKEN

    return [token for token in (args.token, os.environ.get(ENV_WORKER_TOKEN)) if token]


def _worker_logging(args: argparse.Namespace) -> None:
    level = os.environ.get("EVORA_LOG_LEVEL", "INFO").strip().upper() or "INFO"
    raw_format = os.environ.get("EVORA_LOG_FORMAT", "json").strip().lower() or "json"
    if level not in LOG_LEVELS:
        raise ValueError(f"EVORA_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}")
    formats: tuple[LogFormat, ...] = get_args(LogFormat)
    fmt = next((f for f in formats if f == raw_format), None)
    if fmt is None:
        raise ValueError("EVORA_LOG_FORMAT must be json or text")
    configure_logging(level, fmt, service="worker", secrets=_worker_tokens(args))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "worker":
        try:
            _worker_logging(args)
        except ValueError as exc:
            print(f"evora: invalid configuration: {exc}", file=sys.stderr)
            return 2
        try:
            return _worker(args)
        except KeyboardInterrupt:
            return 130
    from evora.config import LOOPBACK, ConfigError, load_settings

    dev = getattr(args, "dev", False)
    try:
        # `evora dev` is on this machine for its user only: the published example tokens
        # are allowed there.
        settings = load_settings(**({"allow_example_tokens": True} if dev else {}))
        if dev and "EVORA_HOST" not in os.environ:
            # `evora dev` stays on this machine unless told otherwise.
            settings = settings.model_copy(update={"host": LOOPBACK})
        configure_logging(
            settings.log_level,
            settings.log_format or ("text" if dev else "json"),
            service=args.command,
            secrets=settings.token_roles(),
        )
        run: Command = args.run
        return run(args, settings)
    except ConfigError as exc:
        print(f"evora: invalid configuration: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
