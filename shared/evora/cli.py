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


Command = Callable[[argparse.Namespace, Settings], int]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evora", description="Evora: a distributed job queue on PostgreSQL."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    migrate = sub.add_parser(
        "migrate", help="apply database migrations (idempotent, safe to run concurrently)"
    )
    migrate.set_defaults(run=_migrate)
    dev = sub.add_parser(
        "dev", help="run Evora on this machine with embedded PostgreSQL (data in EVORA_DATA_DIR)"
    )
    dev.set_defaults(run=_dev, dev=True)
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
