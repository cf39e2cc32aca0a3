"""`evora jobs`, `evora queues`, `evora dlq`: what each does with the api."""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from evora.protocol.states import JobState
from evora_services.cli.admin.exits import Exit
from evora_services.cli.admin.output import record, table

# `evora`'s parser imports this module for every command, `--help` and `migrate` too: the
# SDK (aiohttp, ssl) and asyncio (ssl) are imported by admin.run, only for an operator
# command, and by the coroutines below, which only run under it.
if TYPE_CHECKING:
    from evora.sdk.client import Client, JobData, SubmitOptions

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
SCHEDULE_COLUMNS = ("name", "cron", "timezone", "queue", "type", "paused", "next_run_at")
LIMIT_COLUMNS = ("key", "concurrency", "rate", "max_pending")
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


Operation = Callable[["Client", argparse.Namespace], Awaitable[Outcome]]


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
    import asyncio  # imported already by admin.run, which runs this (see above)

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
    return _job(job) if args.wait is None else await _wait_for(client, job, args.wait)


async def _wait_for(client: Client, job: JobData, wait: float) -> Outcome:
    """The job once it finished, or as it is after `wait` seconds; exit 0 only if it
    COMPLETED, and a line on stderr saying why not."""
    import asyncio  # imported already by admin.run, which runs this (see above)

    deadline = time.monotonic() + wait
    while job["state"] not in FINAL and time.monotonic() < deadline:
        await asyncio.sleep(WAIT_POLL_SECONDS)
        job = await client.get(job["id"])
    shown = _job(job)
    if job["state"] == JobState.COMPLETED:
        return shown
    if job["state"] in FINAL:
        note = f"job {job['id']} ended {job['state']}, not COMPLETED"
        return Outcome(shown.data, shown.text, Exit.JOB_FAILED, note)
    note = f"job {job['id']} is still {job['state']} after waiting {wait:g} s"
    return Outcome(shown.data, shown.text, Exit.TIMED_OUT, note)


async def submit_job(client: Client, args: argparse.Namespace) -> Outcome:
    options: SubmitOptions = {}
    if args.key is not None:
        options["idempotency_key"] = args.key
    if args.priority is not None:
        options["priority"] = args.priority
    if args.delay is not None:
        options["delay_seconds"] = args.delay
    if args.max_attempts is not None:
        options["max_attempts"] = args.max_attempts
    submitted = await client.submit(args.queue, args.type, args.payload, **options)
    if args.wait is not None:
        return await _wait_for(client, submitted.job, args.wait)
    shown = _job(submitted.job)
    if submitted.replayed:  # said, as the job may be in any state by now
        return Outcome(shown.data, "replayed: the job this key made before\n" + shown.text)
    return shown


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


# The one command that computes what `evora analytics` shows.
PIPELINE_RUN_HINT = (
    "the pipeline has not run yet: `evora pipeline run` computes the analytics (PySpark and "
    "Java needed; on evora dev, start it with `bash scripts/run.sh --with-pipeline`)"
)


def _totals_row(queue: dict[str, Any]) -> dict[str, Any]:
    """A queue's totals as `pipeline/live` per key ("-" for a side without the queue)."""
    ours = (queue.get("pipeline") or {}).get("totals") or {}
    live = (queue.get("projector") or {}).get("totals") or {}
    row: dict[str, Any] = {"queue": queue["queue"], "agree": "yes" if queue["agree"] else "NO"}
    for key in ours or live:
        row[key] = f"{ours.get(key, '-')}/{live.get(key, '-')}"
    return row


TYPE_ANALYTICS_COLUMNS = (
    "type",
    "jobs",
    "retry_rate",
    "dlq_rate",
    "wait_p95_ms",
    "run_p95_ms",
    "top_failure",
)


def _type_row(row: dict[str, Any]) -> dict[str, Any]:
    rates = row["rates"] or {}
    wait, run = (row["latency"].get(kind) or {} for kind in ("wait", "run"))
    reasons = row["failure_reasons"]
    return {
        "type": row["type"],
        "jobs": rates.get("jobs"),
        "retry_rate": rates.get("retry_rate"),
        "dlq_rate": rates.get("dlq_rate"),
        "wait_p95_ms": wait.get("p95_ms"),
        "run_p95_ms": run.get("p95_ms"),
        "top_failure": _error_line(
            {"type": reasons[0]["error_type"], "message": reasons[0]["message"]}
        )
        if reasons
        else None,
    }


async def _queue_analytics(client: Client, queue: str) -> Outcome:
    found = await client.queue_analytics(queue)
    if not found["ran"]:
        return Outcome(found, PIPELINE_RUN_HINT)
    if not found["types"]:
        return Outcome(found, f"queue {queue} had no event in the latest pipeline run")
    rows = [_type_row(t) for t in found["types"]]
    return Outcome(found, table(rows, TYPE_ANALYTICS_COLUMNS))


async def analytics(client: Client, args: argparse.Namespace) -> Outcome:
    if args.queue:
        return await _queue_analytics(client, args.queue)
    found = await client.analytics()
    queues = found["queues"]
    keys = next(
        (list(side["totals"]) for q in queues for side in (q["pipeline"], q["projector"]) if side),
        [],
    )
    lines = []
    if found["ran"]:
        as_of, live = found["as_of"], found["projector_as_of"]
        lines.append(
            f"pipeline run {as_of['run_id']} at {as_of['at']}: {as_of['events']} events, seq up "
            f"to {as_of['seq']}; live totals (projector) at seq {live['seq']}"
        )
    else:
        lines.append(PIPELINE_RUN_HINT)
    if queues:
        lines.append("totals as pipeline/live:")
        lines.append(table([_totals_row(q) for q in queues], ("queue", *keys, "agree")))
    else:
        lines.append("no queues")
    return Outcome(found, "\n".join(lines))


def _schedule_row(schedule: dict[str, Any]) -> dict[str, Any]:
    job = schedule.get("job") or {}
    return {**schedule, "queue": job.get("queue"), "type": job.get("type")}


async def list_schedules(client: Client, args: argparse.Namespace) -> Outcome:
    schedules = await client.schedules()
    rows = [_schedule_row(s) for s in schedules]
    text = table(rows, SCHEDULE_COLUMNS) if rows else "no schedules"
    return Outcome({"schedules": schedules}, text)


async def get_schedule(client: Client, args: argparse.Namespace) -> Outcome:
    schedule = await client.schedule(args.name)
    return Outcome(schedule, record(schedule))


async def put_schedule(client: Client, args: argparse.Namespace) -> Outcome:
    schedule = await client.put_schedule(
        args.name,
        args.cron,
        {"queue": args.queue, "type": args.type, "payload": args.payload},
        timezone=args.timezone,
        misfire=args.misfire,
    )
    return Outcome(schedule, record(schedule))


async def delete_schedule(client: Client, args: argparse.Namespace) -> Outcome:
    await client.delete_schedule(args.name)
    return Outcome({"deleted": args.name}, f"schedule {args.name} deleted")


async def pause_schedule(client: Client, args: argparse.Namespace) -> Outcome:
    schedule = await client.pause_schedule(args.name)
    return Outcome(schedule, f"schedule {args.name} paused")


async def resume_schedule(client: Client, args: argparse.Namespace) -> Outcome:
    schedule = await client.resume_schedule(args.name)
    return Outcome(schedule, f"schedule {args.name} resumed")


async def trigger_schedule(client: Client, args: argparse.Namespace) -> Outcome:
    return _job(await client.trigger_schedule(args.name))


def _limit_row(limit: dict[str, Any]) -> dict[str, Any]:
    rate = limit.get("rate")
    shown = f"{rate['limit']}/{rate['per_seconds']:g}s" if isinstance(rate, dict) else None
    return {**limit, "rate": shown}


async def list_limits(client: Client, args: argparse.Namespace) -> Outcome:
    limits = await client.limits()
    text = table([_limit_row(x) for x in limits], LIMIT_COLUMNS) if limits else "no limits"
    return Outcome({"limits": limits}, text)


async def get_limit(client: Client, args: argparse.Namespace) -> Outcome:
    limit = await client.limit(args.key)
    return Outcome(limit, record(_limit_row(limit)))


async def set_limit(client: Client, args: argparse.Namespace) -> Outcome:
    limit = await client.set_limit(
        args.key, concurrency=args.concurrency, rate=args.rate, max_pending=args.max_pending
    )
    return Outcome(limit, record(_limit_row(limit)))


async def delete_limit(client: Client, args: argparse.Namespace) -> Outcome:
    await client.delete_limit(args.key)
    return Outcome({"deleted": args.key}, f"limit {args.key} deleted")
