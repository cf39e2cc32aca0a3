"""Running one operator command: the client from the environment, the answer printed, and
an exit status that says what happened (`Exit`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Mapping

from evora.sdk.client import Client
from evora.sdk.errors import (
    ConflictError,
    EvoraClientError,
    EvoraConnectionError,
    EvoraHTTPError,
    ForbiddenError,
    NotFoundError,
    UnauthorizedError,
)
from evora_services.cli.admin.commands import Operation, Outcome
from evora_services.cli.admin.exits import Exit
from evora_services.cli.admin.output import as_json
from evora_services.cli.admin.parser import DEFAULT_API_URL, ENV_ADMIN_TOKEN, ENV_API_URL

# One exchange answers quickly or not at all: a script should not hang on a dead api.
TIMEOUT_SECONDS = 30.0
UNAVAILABLE = 503


def _status(exc: EvoraClientError) -> Exit:
    if isinstance(exc, EvoraConnectionError):
        return Exit.UNREACHABLE
    if isinstance(exc, NotFoundError):
        return Exit.NOT_FOUND
    if isinstance(exc, ConflictError):
        return Exit.CONFLICT
    if isinstance(exc, UnauthorizedError | ForbiddenError):
        return Exit.UNAUTHORIZED
    if isinstance(exc, EvoraHTTPError) and exc.status == UNAVAILABLE:
        return Exit.UNREACHABLE
    return Exit.REFUSED


async def _operate(operation: Operation, args: argparse.Namespace, url: str, token: str) -> Outcome:
    async with Client(url, token, timeout=TIMEOUT_SECONDS, retries=1) as client:
        return await operation(client, args)


def run(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> int:
    url = args.url or environ.get(ENV_API_URL) or DEFAULT_API_URL
    token = args.token or environ.get(ENV_ADMIN_TOKEN)
    if not token:
        print(f"evora: no token: set {ENV_ADMIN_TOKEN} or pass --token", file=sys.stderr)
        return Exit.USAGE
    try:
        outcome = asyncio.run(_operate(args.operate, args, url, token))
    except EvoraClientError as exc:
        print(f"evora {args.command}: {exc}", file=sys.stderr)
        return _status(exc)
    print(as_json(outcome.data) if args.json else outcome.text)
    if outcome.note is not None:
        print(f"evora {args.command}: {outcome.note} (exit {int(outcome.status)})", file=sys.stderr)
    return outcome.status
