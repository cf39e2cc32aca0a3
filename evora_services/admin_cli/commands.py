"""`evora jobs`, `evora queues`, `evora dlq`: what each does with the api."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from evora.protocol.states import JobState
from evora.sdk.client import Client, JobData
from evora_services.admin_cli.exits import Exit
from evora_services.admin_cli.output import record, table

JOB_COLUMNS = ("id", "queue", "type", "state", "attempt", "created_at")
JOB_FIELDS = (
    "id",
    "queue",
    "type",
    "state",
    "attempt",
    "max_attempts",
    "priority",
    "worker_id",
    "run_at",
    "created_at",
    "started_at",
    "finished_at",
    "cancel_requested",
    "progress",
    "result",
    "last_error",
    "payload",
)
# Why each job is there: the reason its move to the DLQ recorded, and its last error.
DLQ_COLUMNS = ("id", "queue", "type", "attempt", "finished_at", "reason", "error")
# An error longer than this is cut in the table (--json and `jobs get` show it whole).
ERROR_WIDTH = 60
EVENT_COLUMNS = ("seq", "at", "event", "from_state", "to_state", "attempt", "worker_id", "data")
QUEUE_COLUMNS = ("queue", "paused", *(state.lower() for state in JobState))
FINAL = frozenset({JobState.COMPLETED, JobState.DLQ, JobState.CANCELLED})
# How often `evora jobs get --wait` asks again.
WAIT_POLL_SECONDS = 0.5


@dataclass(frozen=True)
class Outcome:
    """What a command found: `data` for --json, `text` for people, and the exit status;
    `note`, when set, says on stderr why the status is not 0."""

    data: Any
    text: str
    status: Exit = Exit.OK
    note: str | None = None


Operation = Callable[[Client, argparse.Namespace], Awaitable[Outcome]]


def _job(job: JobData) -> Outcome:
    return Outcome(job, record(job, JOB_FIELDS))


def _jobs(jobs: list[JobData], after: str | None = None) -> Outcome:
    text = table(jobs, JOB_COLUMNS) if jobs else "no jobs"
    if after is not None:
        text += f"\nmore: --after {after}"
    return Outcome({"jobs": jobs, "next": after}, text)


async def list_jobs(client: Client, args: argparse.Namespace) -> Outcome:
    page = await client.list_jobs(
        queue=args.queue, state=args.state, type=args.type, limit=args.limit, after=args.after
    )
    return _jobs(page.jobs, page.next)


def _dlq_reason(events: list[dict[str, Any]]) -> str | None:
    """The reason the latest move into the DLQ recorded (`failed`, `not_retryable`,
    `expired`, `lease_expired`, ...: docs/http-api.md, the event resource)."""
    moves = [e for e in events if e.get("to_state") == JobState.DLQ]
    data = moves[-1].get("data") if moves else None
    return data.get("reason") if isinstance(data, dict) else None


def _error_line(error: Any) -> str | None:
    if not isinstance(error, dict):
        return None
    message = str(error.get("message") or "").split("\n", 1)[0]
    line = f"{error['type']}: {message}" if error.get("type") else message
    return line if len(line) <= ERROR_WIDTH else line[: ERROR_WIDTH - 3] + "..."


async def list_dlq(client: Client, args: argparse.Namespace) -> Outcome:
    page = await client.list_jobs(
        queue=args.queue, state=JobState.DLQ, type=args.type, limit=args.limit, after=args.after
    )
    histories = await asyncio.gather(*(client.events(job["id"]) for job in page.jobs))
    jobs = [
        {**job, "dlq_reason": _dlq_reason(events)}
        for job, events in zip(page.jobs, histories, strict=True)
    ]
    rows = [
        {**job, "reason": job["dlq_reason"], "error": _error_line(job.get("last_error"))}
        for job in jobs
    ]
    text = table(rows, DLQ_COLUMNS) if jobs else "no jobs"
    if page.next is not None:
        text += f"\nmore: --after {page.next}"
    return Outcome({"jobs": jobs, "next": page.next}, text)


async def get_job(client: Client, args: argparse.Namespace) -> Outcome:
    job = await client.get(args.id)
    if args.wait is None:
        return _job(job)
    deadline = time.monotonic() + args.wait
    while job["state"] not in FINAL and time.monotonic() < deadline:
        await asyncio.sleep(WAIT_POLL_SECONDS)
        job = await client.get(args.id)
    shown = _job(job)
    if job["state"] == JobState.COMPLETED:
        return shown
    if job["state"] in FINAL:
        note = f"job {args.id} ended {job['state']}, not COMPLETED"
        return Outcome(shown.data, shown.text, Exit.JOB_FAILED, note)
    note = f"job {args.id} is still {job['state']} after waiting {args.wait:g} s"
    return Outcome(shown.data, shown.text, Exit.TIMED_OUT, note)


async def job_events(client: Client, args: argparse.Namespace) -> Outcome:
    events = await client.events(args.id)
    return Outcome({"events": events}, table(events, EVENT_COLUMNS))


async def retry_jobs(client: Client, args: argparse.Namespace) -> Outcome:
    return _jobs([await client.retry(job_id) for job_id in args.ids])


async def cancel_jobs(client: Client, args: argparse.Namespace) -> Outcome:
    return _jobs([await client.cancel(job_id) for job_id in args.ids])


async def discard_jobs(client: Client, args: argparse.Namespace) -> Outcome:
    return _jobs([await client.discard(job_id) for job_id in args.ids])


def _queue_row(stats: dict[str, Any]) -> dict[str, Any]:
    counts = stats.get("counts", {})
    return {
        "queue": stats.get("queue"),
        "paused": stats.get("paused"),
        **{state.lower(): counts.get(state, 0) for state in JobState},
    }


async def queue_stats(client: Client, args: argparse.Namespace) -> Outcome:
    if getattr(args, "queue", None):
        stats = await client.stats(args.queue)
        return Outcome(stats, record(stats))
    queues = await client.queues()
    text = table([_queue_row(q) for q in queues], QUEUE_COLUMNS) if queues else "no queues"
    return Outcome({"queues": queues}, text)


async def pause_queue(client: Client, args: argparse.Namespace) -> Outcome:
    state = await client.pause(args.queue)
    return Outcome(state, f"queue {args.queue} paused")


async def resume_queue(client: Client, args: argparse.Namespace) -> Outcome:
    state = await client.resume(args.queue)
    return Outcome(state, f"queue {args.queue} resumed")


async def redrive_queue(client: Client, args: argparse.Namespace) -> Outcome:
    moved = await client.redrive(args.queue, type=args.type, limit=args.limit)
    return Outcome({"redriven": moved}, f"{moved} job(s) moved from the DLQ to PENDING")
