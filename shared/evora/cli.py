"""The `evora` command (CONTRACT section 1). Subcommands appear here as they are built."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Sequence

from evora.config import LOOPBACK, ConfigError, Settings, load_settings


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
    from evora.dev import run_dev

    return run_dev(settings)


def _api(args: argparse.Namespace, settings: Settings) -> int:
    from services.api.main import run

    return run(settings)


def _dispatcher(args: argparse.Namespace, settings: Settings) -> int:
    from services.dispatcher.main import run

    return run(settings)


def _projector(args: argparse.Namespace, settings: Settings) -> int:
    from services.projector.main import run, run_rebuild

    return run_rebuild(settings) if args.rebuild else run(settings)


def _sweeper(args: argparse.Namespace, settings: Settings) -> int:
    from services.sweeper.main import run

    return run(settings)


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from evora.sdk.worker import run_worker_from_module

    queues = [q.strip() for q in args.queues.split(",") if q.strip()] if args.queues else None
    return run_worker_from_module(
        args.module,
        url=args.url,
        token=args.token,
        queues=queues,
        concurrency=args.concurrency,
    )


Command = Callable[[argparse.Namespace, Settings], int]


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = load_settings()
        if getattr(args, "dev", False) and "EVORA_HOST" not in os.environ:
            # `evora dev` stays on this machine unless told otherwise.
            settings = settings.model_copy(update={"host": LOOPBACK})
        logging.basicConfig(
            level=settings.log_level,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
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
