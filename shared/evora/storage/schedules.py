"""The schedule store: schedules (docs/schedules.md) and the scheduler's one step, firing
the due ticks of one schedule in one transaction (statements in sql/schedules.sql).

Exactly one job per tick comes from the database, not from who runs the scheduler: a step
locks the schedule's row (SKIP LOCKED, so replicas spread the work), submits each tick's job
through the same submission as `POST /v1/jobs` with the idempotency key
`schedule:<name>:<tick>`, and moves the row past those ticks, all in one commit. A replica
that dies mid-step leaves nothing behind; one that races another finds the row locked or
already moved on, and even a stale tick computed twice is the same key, one job.
"""

from __future__ import annotations

import logging
import sys
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any
from uuid import UUID

import asyncpg
import orjson
from pydantic import ValidationError

from evora.domain.cron import CronError, CronSchedule
from evora.domain.errors import (
    EvoraError,
    IdempotencyConflict,
    IdempotentJobGone,
    InvalidDependency,
    ScheduleNotFound,
)
from evora.domain.misfire import Misfire, Step, plan
from evora.protocol.fields import exact_json, with_exact_values
from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import JobStore
from evora.storage.rows import JobDict
from evora.storage.statements import load
from evora.storage.submissions import Submitted

log = logging.getLogger(__name__)

(
    LOCK,
    UNMEETABLE_DEPENDENCIES,
    UPSERT,
    GET,
    PAGE,
    DELETE,
    PAUSE,
    RESUME,
    TAKE_DUE,
    ADVANCE,
    FAIL,
    EARLIEST_DUE,
    NAME_SUBMISSION,
) = load(
    "schedules",
    "lock",
    "unmeetable_dependencies",
    "upsert",
    "get",
    "page",
    "delete",
    "pause",
    "resume",
    "take_due",
    "advance",
    "fail",
    "earliest_due",
    "name_submission",
)

ScheduleDict = dict[str, Any]

_TRUSTED = {"max_payload_bytes": sys.maxsize}


def rfc3339(instant: datetime) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tick_key(name: str, tick: datetime) -> str:
    return f"schedule:{name}:{rfc3339(tick)}"


def trigger_key(name: str) -> str:
    return f"schedule:{name}:trigger:{uuid.uuid4()}"


@dataclass(frozen=True)
class ScheduleSpec:
    """What a PUT says: validated at the edge (the api accepts five cron fields; tests may
    store a leading seconds field)."""

    cron: str
    timezone: str
    job: dict[str, Any]  # a submission without idempotency_key, as JSON
    misfire: Misfire
    misfire_grace_seconds: int
    paused: bool

    def schedule(self) -> CronSchedule:
        return CronSchedule.of(self.cron, self.timezone, with_seconds=True)


def _schedule_of(row: asyncpg.Record) -> CronSchedule:
    return CronSchedule.of(row["cron"], row["timezone"], with_seconds=True)


def schedule_from_row(row: asyncpg.Record) -> ScheduleDict:
    return {
        "name": row["name"],
        "cron": row["cron"],
        "timezone": row["timezone"],
        "job": row["job"],
        "misfire": row["misfire"],
        "misfire_grace_seconds": row["misfire_grace_seconds"],
        "paused": row["paused"],
        # a paused schedule makes no jobs, so it has no next run
        "next_run_at": None if row["paused"] else row["next_run_at"],
        "last_run_at": row["last_run_at"],
        "last_job_id": row["last_job_id"],
        "last_error": row["last_error"],
        "last_error_at": row["last_error_at"],
        "failing_since": row["failing_since"],
        "consecutive_failures": row["consecutive_failures"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


@dataclass(frozen=True)
class Made:
    tick: datetime
    job_id: UUID
    created: bool  # False: the tick's key already had its job


class FailureReason(StrEnum):
    """Why a step made none of its jobs (a fixed set: the metric's label)."""

    UNREADABLE = "unreadable"  # the stored cron, zone or job no longer parses
    REJECTED = "rejected"  # the submission was refused (a dependency, a value)


@dataclass(frozen=True)
class Failure:
    reason: FailureReason
    error: Exception


@dataclass(frozen=True)
class Fired:
    """One step of one schedule."""

    name: str
    step: Step
    made: list[Made]
    failure: Failure | None = None


@dataclass(frozen=True)
class SchedulePage:
    schedules: list[ScheduleDict]
    next_after: str | None  # the name to continue after, or None at the end


class ScheduleStore:
    def __init__(self, pool: asyncpg.Pool, jobs: JobStore) -> None:
        self._pool = pool
        self._jobs = jobs

    # -- the api -----------------------------------------------------------------------

    async def put(self, name: str, spec: ScheduleSpec, now: datetime) -> tuple[ScheduleDict, bool]:
        """Create or replace; True when created. A replaced schedule keeps what it has
        handled, so no tick makes a second job and, unless it was paused, ticks it missed
        meanwhile are still handled by its policy; a new or resumed one starts from now."""
        schedule = spec.schedule()
        async with self._pool.acquire() as conn, conn.transaction():
            await _check_dependencies(conn, spec.job)
            old = await conn.fetchrow(LOCK, name)
            ticked_until = now
            if old is not None and not old["paused"]:
                ticked_until = old["ticked_until"]
            elif old is not None:
                ticked_until = max(old["ticked_until"], now)
            row = await conn.fetchrow(
                UPSERT,
                name,
                spec.cron,
                spec.timezone,
                spec.job,
                spec.misfire.value,
                spec.misfire_grace_seconds,
                spec.paused,
                ticked_until,
                schedule.next_after(ticked_until),
            )
        return schedule_from_row(row), bool(row["created"])

    async def get(self, name: str) -> ScheduleDict:
        row = await self._pool.fetchrow(GET, name)
        if row is None:
            raise _not_found(name)
        return schedule_from_row(row)

    async def page(self, *, after: str | None = None, limit: int = 50) -> SchedulePage:
        rows = await self._pool.fetch(PAGE, after, limit + 1)
        more = len(rows) > limit
        rows = rows[:limit]
        return SchedulePage(
            [schedule_from_row(r) for r in rows], rows[-1]["name"] if more and rows else None
        )

    async def delete(self, name: str) -> None:
        if await self._pool.fetchval(DELETE, name) is None:
            raise _not_found(name)

    async def pause(self, name: str) -> ScheduleDict:
        row = await self._pool.fetchrow(PAUSE, name)
        if row is None:
            raise _not_found(name)
        return schedule_from_row(row)

    async def resume(self, name: str, now: datetime) -> ScheduleDict:
        """Ticks that fell while it was paused stay unmade (they are not missed: nobody
        was supposed to make them)."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(LOCK, name)
            if row is None:
                raise _not_found(name)
            if row["paused"]:
                ticked_until = max(row["ticked_until"], now)
                row = await conn.fetchrow(
                    RESUME, name, ticked_until, _schedule_of(row).next_after(ticked_until)
                )
        return schedule_from_row(row)

    async def trigger(self, name: str, now: datetime) -> JobDict:
        """One job now, outside the ticks (paused or not), with a key of its own."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(LOCK, name)
            if row is None:
                raise _not_found(name)
            outcome = await self._submit(
                conn, _job_of(row), trigger_key(name), {"schedule": name, "triggered": True}
            )
            if isinstance(outcome, EvoraError):  # a fresh uuid cannot collide
                raise outcome
            await conn.execute(
                ADVANCE, name, row["ticked_until"], row["next_run_at"], now, outcome.id
            )
        return outcome.job

    # -- the scheduler -----------------------------------------------------------------

    async def earliest_due(self) -> datetime | None:
        due: datetime | None = await self._pool.fetchval(EARLIEST_DUE)
        return due

    async def fire_due(self, now: datetime) -> Fired | None:
        """One step for one due schedule no other transaction holds (None: there is none):
        its ticks up to `now` handled by its policy, in one transaction."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(TAKE_DUE, now)
            if row is None:
                return None
            name = row["name"]
            try:
                schedule = _schedule_of(row)
            except CronError as exc:
                # What was stored was valid; a zone can still vanish from the system's tz
                # database. With no next tick to wait for, it stops until it is put again.
                failure = Failure(FailureReason.UNREADABLE, exc)
                await self._fail(conn, name, Step([], 0, now), None, failure, now)
                return Fired(name, Step([], 0, now), [], failure)
            step = plan(
                schedule,
                Misfire(row["misfire"]),
                timedelta(seconds=row["misfire_grace_seconds"]),
                row["ticked_until"],
                now,
            )
            try:
                # a savepoint: a statement the database refused leaves the transaction
                # usable for recording the failure
                async with conn.transaction():
                    made = await self._make(conn, name, _job_of(row), step)
            except _REFUSED as exc:
                # Left due, the schedule would be taken first at every step and hold up every
                # schedule behind it; its step's ticks are handled, without their jobs.
                reason = (
                    FailureReason.UNREADABLE
                    if isinstance(exc, ValidationError)
                    else FailureReason.REJECTED
                )
                failure = Failure(reason, exc)
                next_run_at = schedule.next_after(step.ticked_until)
                await self._fail(conn, name, step, next_run_at, failure, now)
                return Fired(name, step, [], failure)
            last = made[-1] if made else None
            await conn.execute(
                ADVANCE,
                name,
                step.ticked_until,
                schedule.next_after(step.ticked_until),
                last.tick if last else None,
                last.job_id if last else None,
            )
        return Fired(name, step, made)

    async def _make(
        self, conn: asyncpg.Connection, name: str, job: JobSubmission, step: Step
    ) -> list[Made]:
        made: list[Made] = []
        for tick in step.fire:
            data = {"schedule": name, "tick": rfc3339(tick)}
            outcome = await self._submit(conn, job, tick_key(name, tick), data)
            if isinstance(outcome, IdempotencyConflict | IdempotentJobGone):
                # The key was taken with other fields (a producer used it), or its job was
                # removed by retention: the tick has had its job, or its chance.
                log.warning("schedule %r tick %s made no job: %s", name, data["tick"], outcome)
                continue
            if isinstance(outcome, EvoraError):  # a dependency the database refused
                raise outcome
            made.append(Made(tick, outcome.id, outcome.created))
        return made

    async def _fail(
        self,
        conn: asyncpg.Connection,
        name: str,
        step: Step,
        next_run_at: datetime | None,
        failure: Failure,
        now: datetime,
    ) -> None:
        error = failure.error
        kind = error.code if isinstance(error, EvoraError) else type(error).__name__
        log.error(
            "schedule %r failed to fire (%s); it waits for its next tick %s: %s",
            name,
            failure.reason.value,
            next_run_at,
            error,
        )
        await conn.execute(
            FAIL,
            name,
            step.ticked_until,
            next_run_at,
            {"message": str(error), "type": kind},
            now,
        )

    async def _submit(
        self, conn: asyncpg.Connection, job: JobSubmission, key: str, data: dict[str, Any]
    ) -> Submitted | EvoraError:
        await conn.execute(NAME_SUBMISSION, orjson.dumps(data).decode())
        [outcome] = await self._jobs.submit_in(
            conn, [job.model_copy(update={"idempotency_key": key})]
        )
        return outcome


# What makes a step fail alone: the stored job no longer parses, the submission is refused
# (a dependency, or a value the database's validation rejects: SQLSTATE classes 22 and 23).
# Anything else (a lost connection, a conflict) fails the step as before, to be retried.
_REFUSED = (
    ValidationError,
    EvoraError,
    asyncpg.DataError,
    asyncpg.IntegrityConstraintViolationError,
)


def _job_of(row: asyncpg.Record) -> JobSubmission:
    # Stored jobs were validated when their schedule was put, with the api's payload limit;
    # this rebuilds one to submit rather than judging it again, with the payload's numbers
    # as stored (the parser would make floats of them).
    raw = row["job_text"].encode()
    job = JobSubmission.model_validate_json(raw, context=_TRUSTED)
    with_exact_values(job, exact_json(raw))
    return job


async def _check_dependencies(conn: asyncpg.Connection, job: dict[str, Any]) -> None:
    """Refuse a job whose dependencies no tick could wait for, as its submission would be:
    every firing would fail. (A dependency removed later fails its firings then, recorded on
    the schedule.)"""
    depends_on = job.get("depends_on") or []
    if not depends_on:
        return
    cancel = job.get("on_dependency_failure", "cancel") == "cancel"
    rows = await conn.fetch(UNMEETABLE_DEPENDENCIES, depends_on, cancel)
    if rows:
        ord_, dep = rows[0]["ord"], rows[0]["id"]
        raise InvalidDependency(
            f"job.depends_on[{ord_ - 1}]: {dep} names no job"
            + (' or a CANCELLED one (with on_dependency_failure "cancel")' if cancel else "")
        )


def _not_found(name: str) -> ScheduleNotFound:
    return ScheduleNotFound(f"no schedule named {name!r}")
