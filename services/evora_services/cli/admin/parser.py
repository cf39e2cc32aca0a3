"""The operator commands' command line, added to `evora`'s own."""

from __future__ import annotations

import argparse
from typing import Any, TypeAlias

import orjson

from evora.protocol.states import JobState
from evora_services.cli.admin import commands
from evora_services.cli.admin.exits import Exit

# A string: the class is generic for type checkers only.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

ENV_API_URL = "EVORA_API_URL"
ENV_ADMIN_TOKEN = "EVORA_ADMIN_TOKEN"
DEFAULT_API_URL = "http://127.0.0.1:8080"

ENVIRONMENT = (
    f"environment: {ENV_API_URL} (default {DEFAULT_API_URL}), {ENV_ADMIN_TOKEN} (an admin "
    "token). Exit status: "
    + ", ".join(f"{status.value} {status.name.lower().replace('_', ' ')}" for status in Exit)
    + "."
)


def _connection() -> argparse.ArgumentParser:
    """--url, --token and --json, for every operator command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help=f"the api's base URL ({ENV_API_URL})")
    common.add_argument("--token", help=f"an admin token ({ENV_ADMIN_TOKEN})")
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return common


def _leaf(
    group: Subparsers, name: str, summary: str, operation: commands.Operation
) -> argparse.ArgumentParser:
    leaf = group.add_parser(
        name,
        help=summary,
        description=f"{summary}.",
        epilog=ENVIRONMENT,
        parents=[_connection()],
    )
    leaf.set_defaults(operate=operation)
    return leaf


def _group(sub: Subparsers, name: str, summary: str, description: str) -> Subparsers:
    parser = sub.add_parser(
        name, help=summary, description=f"{summary}. {description}", epilog=ENVIRONMENT
    )
    return parser.add_subparsers(dest=f"{name}_command", required=True, metavar="ACTION")


def _listing(parser: argparse.ArgumentParser, *, state: bool) -> None:
    parser.add_argument("--queue", help="only this queue")
    parser.add_argument("--type", help="only this job type")
    if state:
        parser.add_argument("--state", choices=[s.value for s in JobState], help="only this state")
    parser.add_argument("--limit", type=int, default=20, help="jobs per page (default 20)")
    parser.add_argument("--after", help="the page after this cursor (printed as `more:`)")


def _json(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None


def _rate(text: str) -> tuple[int, float]:
    """`N/SECONDS`: at most N claims per SECONDS."""
    limit, _, seconds = text.partition("/")
    try:
        return int(limit), float(seconds.removesuffix("s"))
    except ValueError:
        raise argparse.ArgumentTypeError("a rate is N/SECONDS, e.g. 10/1 or 100/60") from None


def _job_fields(parser: argparse.ArgumentParser) -> None:
    """QUEUE TYPE [PAYLOAD]: the job to submit (now, or at a schedule's ticks)."""
    parser.add_argument("queue", metavar="QUEUE")
    parser.add_argument("type", metavar="TYPE")
    parser.add_argument(
        "payload",
        nargs="?",
        type=_json,
        default={},
        metavar="PAYLOAD",
        help="the payload as JSON (default {})",
    )


def _wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait",
        type=float,
        metavar="SECONDS",
        help="wait up to SECONDS for the job to finish; exit 0 only if it COMPLETED",
    )


def _ids(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ids", nargs="+", metavar="ID", help="job id(s)")


def add_commands(sub: Subparsers) -> None:
    jobs = _group(sub, "jobs", "look at and act on jobs", "Newest first; ids are shown whole.")
    listing = _leaf(jobs, "list", "list jobs, newest first", commands.list_jobs)
    _listing(listing, state=True)
    get = _leaf(jobs, "get", "show one job", commands.get_job)
    get.add_argument("id", metavar="ID")
    _wait(get)
    submit = _leaf(jobs, "submit", "submit a job", commands.submit_job)
    _job_fields(submit)
    submit.add_argument("--key", help="an idempotency key: a repeat returns the same job")
    submit.add_argument("--priority", type=int, help="lower is claimed first (default 0)")
    submit.add_argument("--delay", type=float, metavar="SECONDS", help="run no sooner")
    submit.add_argument("--max-attempts", type=int, help="attempts before the DLQ")
    _wait(submit)
    _leaf(jobs, "events", "show a job's events, oldest first", commands.job_events).add_argument(
        "id", metavar="ID"
    )
    _ids(_leaf(jobs, "retry", "move DLQ jobs back to PENDING", commands.retry_jobs))
    _ids(_leaf(jobs, "cancel", "cancel jobs", commands.cancel_jobs))

    _leaf(
        sub,
        "analytics",
        "the latest `evora pipeline run` per queue, beside the live totals; per job type "
        "with QUEUE",
        commands.analytics,
    ).add_argument("queue", nargs="?", metavar="QUEUE")

    queues = _group(sub, "queues", "queue stats and control", "Stats come from the read models.")
    _leaf(queues, "stats", "stats of every queue, or of one", commands.queue_stats).add_argument(
        "queue", nargs="?", metavar="QUEUE"
    )
    for name, summary, operation in (
        ("pause", "stop handing out a queue's jobs", commands.pause_queue),
        ("resume", "hand out a queue's jobs again", commands.resume_queue),
    ):
        _leaf(queues, name, summary, operation).add_argument("queue", metavar="QUEUE")
    redrive = _leaf(
        queues, "redrive", "move a queue's DLQ jobs back to PENDING", commands.redrive_queue
    )
    redrive.add_argument("queue", metavar="QUEUE")
    redrive.add_argument("--type", help="only jobs of this type")
    redrive.add_argument("--limit", type=int, help="at most this many")

    dlq = _group(sub, "dlq", "the dead-letter queue", "Jobs that failed for good.")
    dlq_list = _leaf(
        dlq, "list", "list DLQ jobs, newest first, with why each is there", commands.list_dlq
    )
    _listing(dlq_list, state=False)
    _ids(_leaf(dlq, "retry", "move DLQ jobs back to PENDING", commands.retry_jobs))
    _ids(_leaf(dlq, "discard", "move DLQ jobs to CANCELLED", commands.discard_jobs))

    schedules = _group(
        sub, "schedules", "periodic jobs", "A schedule submits a job at every tick of a cron."
    )
    _leaf(schedules, "list", "every schedule", commands.list_schedules)
    put = _leaf(schedules, "put", "create or replace a schedule", commands.put_schedule)
    put.add_argument("name", metavar="NAME")
    put.add_argument("cron", metavar="CRON", help="five fields, e.g. '0 9 * * 1-5'")
    _job_fields(put)
    put.add_argument("--timezone", help="an IANA zone the cron is read in (default UTC)")
    put.add_argument("--misfire", choices=["skip", "run_once", "catch_up"])
    for name, summary, operation in (
        ("get", "show a schedule", commands.get_schedule),
        ("delete", "delete a schedule (its jobs stay)", commands.delete_schedule),
        ("pause", "make no jobs until resumed", commands.pause_schedule),
        ("resume", "make jobs again from the next tick", commands.resume_schedule),
        ("trigger", "make one job now, outside the ticks", commands.trigger_schedule),
    ):
        _leaf(schedules, name, summary, operation).add_argument("name", metavar="NAME")

    limits = _group(
        sub, "limits", "concurrency and rate limits", "Jobs hold keys; a limit caps a key."
    )
    _leaf(limits, "list", "every limit", commands.list_limits)
    set_limit = _leaf(limits, "set", "create or replace a limit", commands.set_limit)
    set_limit.add_argument("key", metavar="KEY", help="tenant:42, queue:<queue>, tenant:*")
    set_limit.add_argument("--concurrency", type=int, help="at most this many RUNNING")
    set_limit.add_argument("--rate", type=_rate, metavar="N/SECONDS", help="claims per period")
    set_limit.add_argument(
        "--max-pending", type=int, help="at most this many waiting to run (PENDING or WAITING)"
    )
    for name, summary, operation in (
        ("get", "the limit governing a key, with its usage", commands.get_limit),
        ("delete", "delete a limit", commands.delete_limit),
    ):
        _leaf(limits, name, summary, operation).add_argument("key", metavar="KEY")
