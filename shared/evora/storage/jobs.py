"""The job store: every operation on jobs, one statement per transition (sql/transitions.sql);
submissions and their idempotency keys are worked out in submissions.py.

Operations that name a job by id and lease token learn from their own statement why an item
changed nothing (`AckResult`); the single-item ones raise the matching typed error of
`evora.domain.errors`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import partial
from typing import Any, Protocol, TypeVar
from uuid import UUID

import asyncpg
import orjson

from evora.coalesce import Coalescer
from evora.domain.errors import (
    CallbackNotFound,
    CallbackSettled,
    EvoraError,
    InvalidDependency,
    InvalidState,
    JobNotFound,
    LeaseLost,
    QueueFull,
)
from evora.protocol.jobs import JobSubmission
from evora.protocol.states import EventName, JobState
from evora.storage import dependencies, listing, queries, traces
from evora.storage.db import jsonb_elements, one_deadline
from evora.storage.dependencies import DependentsPage
from evora.storage.notify import DEBOUNCE_SECONDS, NotifyDebouncer
from evora.storage.rows import JobDict, claimed_job_from_row, event_from_row, job_from_row
from evora.storage.submissions import Submitted, needs_transaction, refs_refused, store

EXPIRY_BATCH = 500
REDRIVE_BATCH = 500


# SQLSTATE classes: data exception, integrity constraint violation, program limit exceeded,
# PL/pgSQL raise.
_ITEM_SQLSTATES = ("22", "23", "54", "P0")


def caused_by_an_item(exc: Exception) -> bool:
    """Whether a failed set-based statement may have failed because of one item's values
    (invalid or out-of-range data, a violated constraint, a size limit, an error raised by
    a trigger, a key without room for the items: QueueFull) rather than because the database
    is unavailable: only such a failure is worth splitting a batch to find the item it
    belongs to (see evora.coalesce). A split admits the requests that fit, in order."""
    if isinstance(exc, QueueFull):
        return True
    return isinstance(exc, asyncpg.PostgresError) and str(exc.sqlstate)[:2] in _ITEM_SQLSTATES


def lock_contended(exc: Exception) -> bool:
    """Whether a statement run with `brief_lock_waits` gave up waiting for a lock another
    transaction holds: it failed whole, so its items can be tried again apart (see
    evora.coalesce), the one that needs the lock waiting for it alone."""
    return isinstance(exc, asyncpg.LockNotAvailableError)


_Item = TypeVar("_Item", contravariant=True)
_Outcome = TypeVar("_Outcome", covariant=True)
T = TypeVar("T")
R = TypeVar("R")


class RequestsFlush(Protocol[_Item, _Outcome]):
    """A store method that handles several independent requests in one statement."""

    def __call__(
        self, items: Sequence[_Item], /, *, brief_lock_waits: bool = False
    ) -> Awaitable[Sequence[_Outcome]]: ...


def coalescing(flush: RequestsFlush[T, R]) -> Coalescer[T, R]:
    """Coalesce concurrent single requests into statements of `flush`: one item the database
    rejects fails alone, and one that must wait for a lock held outside waits alone."""
    return Coalescer(
        partial(flush, brief_lock_waits=True),
        isolate=caused_by_an_item,
        contended=lock_contended,
        patient=flush,
    )


@dataclass(frozen=True)
class Heartbeat:
    lease_expires_at: datetime
    cancel_requested: bool
    # past the job's max_duration_seconds (docs/jobs-that-wait.md)
    timeout_requested: bool


@dataclass(frozen=True)
class Cancelled:
    job: JobDict
    # False when the job was RUNNING: only `cancel_requested` is set, the worker decides.
    immediate: bool


@dataclass(frozen=True)
class Suspended:
    job: JobDict
    # the one-time credential that resolves the callback; None when a cancel requested won
    callback_id: str | None


@dataclass(frozen=True)
class Spawned:
    job: JobDict
    # the children, ids only (a fan-out of thousands is not answered job by job); empty
    # when a cancel requested won and nothing was submitted
    children: list[Submitted]


@dataclass(frozen=True)
class Completion:
    id: UUID
    lease_token: UUID
    result: Any = None


@dataclass(frozen=True)
class Failure:
    id: UUID
    lease_token: UUID
    message: str
    error_type: str | None = None
    retryable: bool = True
    retry_in_seconds: float | None = None
    traceback: str | None = None
    # an upstream's rate limit (docs/flow-control.md, "Upstream retry-after"): the key whose
    # bucket is drained for `retry_in_seconds`, the attempt handed back uncounted
    retry_after_key: str | None = None

    def error(self) -> dict[str, Any]:
        error = {"message": self.message, "type": self.error_type}
        if self.traceback is not None:
            error["traceback"] = self.traceback
        return error


class AckResult(StrEnum):
    """How one item sent with a lease token ended, each answered as if it had been sent
    alone; the `outcome` column of the statements in sql/transitions.sql."""

    DONE = "done"  # it changed its job, or repeats a completion that did
    LEASE_LOST = "lease_lost"  # its token is not the job's current lease
    NOT_FOUND = "not_found"  # no such job

    def raise_unless_done(self, job_id: UUID) -> None:
        if self is AckResult.NOT_FOUND:
            raise JobNotFound(f"job {job_id} not found")
        if self is AckResult.LEASE_LOST:
            raise LeaseLost(f"the lease token is not the current lease of job {job_id}")


_ACK_RESULTS = {result.value: result for result in AckResult}


@dataclass(frozen=True)
class AckOutcome:
    id: UUID
    result: AckResult
    job: JobDict | None  # when DONE, if asked for

    def job_or_raise(self) -> JobDict:
        self.result.raise_unless_done(self.id)
        if self.job is None:
            raise ValueError("the outcome was asked for without its job")
        return self.job


class Decision(StrEnum):
    """How cancel, retry or discard of one job ended: the `outcome` column of their
    statements in sql/transitions.sql, which return the job either way."""

    DONE = "done"  # the job moved (or, for a RUNNING job, a cancel was requested)
    REFUSED = "refused"  # the job's state does not allow the transition
    NOT_FOUND = "not_found"  # no such job


@dataclass(frozen=True)
class JobPage:
    jobs: list[JobDict]
    next_after: UUID | None  # the id to continue below, or None at the end


class JobStore:
    def __init__(self, pool: asyncpg.Pool, *, hint_window: float = DEBOUNCE_SECONDS) -> None:
        self._pool = pool
        self._notify = NotifyDebouncer(self._send_hints, hint_window)

    @property
    def pool(self) -> asyncpg.Pool:
        """The store's pool, for statements that change no state and send no hints
        (evora.storage.checkpoints)."""
        return self._pool

    async def _send_hints(self, queues: list[str]) -> None:
        await self._pool.execute(queries.NOTIFY_QUEUES, queues)

    async def close(self) -> None:
        """Send the hints still owed; call before closing the pool."""
        await self._notify.close()

    async def _change(
        self,
        conn: asyncpg.Connection | asyncpg.Pool,
        query: str,
        *args: Any,
        committed: bool = True,
        with_jobs: bool | None = None,
    ) -> list[asyncpg.Record]:
        """Run a transition statement whose parameters end with the queues this process
        notified recently (see notify.py) and, for acks, whether to return the jobs
        (`with_jobs`); remember the queues it notified now. Inside a transaction
        (`committed=False`) the caller settles the hints it owes after commit."""
        tail: tuple[Any, ...] = (self._notify.suppressed(),)
        if with_jobs is not None:
            tail += (with_jobs,)
        rows: list[asyncpg.Record] = await conn.fetch(query, *args, *tail)
        if rows:
            self._notify.record(rows[0]["notified"])
            if committed:
                self._owe(rows)
        return rows

    def _owe(self, rows: Sequence[asyncpg.Record]) -> None:
        if rows:
            self._notify.owe(rows[0]["owed"])

    # -- producers ---------------------------------------------------------------------

    async def submit(self, submission: JobSubmission) -> Submitted:
        return (await self.submit_batch([submission]))[0]

    async def submit_each(
        self,
        submissions: Sequence[JobSubmission],
        traceparents: Sequence[str | None] | None = None,
        *,
        brief_lock_waits: bool = False,
    ) -> list[Submitted | EvoraError]:
        """Store independent submissions (concurrent single requests) in one statement. Each
        gets its own outcome: one item's idempotency conflict leaves the others stored, so no
        transaction is needed around the one atomic statement, unless some carry a
        `traceparent` (in submission order) to be kept with their jobs, or the statement is
        to give up waiting for a lock at once (`brief_lock_waits`: see `lock_contended`).
        Each is a request of its own, with its own `ref:` names: having no earlier item, it
        can name none, and no other's job (see `refs_refused`)."""
        refused = [refs_refused(sub) for sub in submissions]
        kept = [index for index, refusal in enumerate(refused) if refusal is None]
        outcomes: list[Submitted | EvoraError | None] = list(refused)
        if not kept:
            return [outcome for outcome in refused if outcome is not None]
        subs = [submissions[index] for index in kept]
        carried = None if traceparents is None else [traceparents[index] for index in kept]
        traced = traces.carried(carried)
        async with self._pool.acquire() as conn:
            if not traced:
                stored, _ = await store(
                    conn,
                    self._change,
                    subs,
                    committed=True,
                    own_refs=True,
                    brief_lock_waits=brief_lock_waits,
                )
            else:
                async with conn.transaction():
                    stored, rows = await store(
                        conn,
                        self._change,
                        subs,
                        committed=False,
                        own_refs=True,
                        brief_lock_waits=brief_lock_waits,
                    )
                    assert carried is not None
                    await traces.keep(conn, rows, carried)
                self._owe(rows)
        for index, outcome in zip(kept, stored, strict=True):
            outcomes[index] = outcome
        return [outcome for outcome in outcomes if outcome is not None]

    async def submit_batch(
        self,
        submissions: Sequence[JobSubmission],
        traceparents: Sequence[str | None] | None = None,
        *,
        with_jobs: bool = True,
    ) -> list[Submitted]:
        """Store all or nothing, with the `traceparent` of each submission that has one. An
        idempotency key seen before (in the database or earlier in this batch) replays its
        job when the fields match and raises IdempotencyConflict when they differ. Without
        `with_jobs` the outcomes carry ids only, which spares decoding every job."""
        # Keyed and dependent items are answered one by one, so one can fail after others
        # were inserted, and traces are written by a second statement; otherwise the single
        # statement is atomic.
        traced = traces.carried(traceparents)
        atomic = needs_transaction(submissions) or traced
        async with self._pool.acquire() as conn:
            transaction = conn.transaction() if atomic else contextlib.nullcontext()
            async with transaction:
                outcomes, rows = await store(
                    conn,
                    self._change,
                    submissions,
                    committed=not atomic,
                    name_repeats=True,
                    with_jobs=with_jobs,
                )
                stored: list[Submitted] = []
                for outcome in outcomes:
                    if isinstance(outcome, EvoraError):
                        raise outcome
                    stored.append(outcome)
                if traced:
                    assert traceparents is not None
                    await traces.keep(conn, rows, traceparents)
        if atomic:
            self._owe(rows)
        return stored

    async def submit_in(
        self, conn: asyncpg.Connection, submissions: Sequence[JobSubmission]
    ) -> list[Submitted | EvoraError]:
        """Store submissions inside the caller's open transaction on `conn`, each with its
        own outcome as in `submit_each`; they commit or roll back with the caller's work.
        No hint is held back by the debounce: the statement notifies every queue itself,
        and PostgreSQL delivers that at commit (never before the jobs are visible) or
        drops it with a rollback, so nothing is owed afterwards."""

        async def notify_all(
            conn: asyncpg.Connection, query: str, *args: Any, with_jobs: bool, **_: Any
        ) -> Any:
            return await conn.fetch(query, *args, [], with_jobs)  # no queue suppressed

        outcomes, _ = await store(conn, notify_all, submissions, committed=False)
        return outcomes

    async def get(self, job_id: UUID) -> JobDict:
        row = await self._pool.fetchrow(queries.GET_JOB, job_id)
        if row is None:
            raise JobNotFound(f"job {job_id} not found")
        return job_from_row(row)

    async def dependents(
        self, job_id: UUID, *, limit: int, after: int | None = None
    ) -> DependentsPage:
        return await dependencies.dependents(self._pool, job_id, limit=limit, after=after)

    async def events(self, job_id: UUID) -> list[dict[str, Any]]:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(queries.JOB_EVENTS, job_id)
            if not rows and await conn.fetchrow(queries.GET_JOB, job_id) is None:
                raise JobNotFound(f"job {job_id} not found")
        return [event_from_row(r) for r in rows]

    async def list_jobs(
        self,
        *,
        queue: str | None = None,
        state: JobState | None = None,
        type: str | None = None,
        limit: int = 50,
        after: UUID | int | None = None,
    ) -> JobPage:
        """A page of jobs, newest first, after the job of id `after` (or, from a cursor of the
        release before migration 0068, after the job of submit_seq `after`)."""
        given = {"queue": queue, "state": state, "type": type}
        names = tuple(name for name, value in given.items() if value is not None)
        args: list[Any] = [given[name] for name in names]
        args.append(limit + 1)
        async with self._pool.acquire() as conn:
            if isinstance(after, int):
                resumed = await listing.resumed_after_seq(conn, after)
                if resumed is None:
                    return JobPage([], None)
                # the listing goes on below an id: the one just above that job's
                after = UUID(int=resumed.int + 1)
            if after is not None:
                args.append(after)
            rows = await conn.fetch(queries.list_jobs(names, after=after is not None), *args)
        more = len(rows) > limit
        rows = rows[:limit]
        return JobPage([job_from_row(r) for r in rows], rows[-1]["id"] if more and rows else None)

    async def cancel(self, job_id: UUID) -> Cancelled:
        """Cancel the job (at once, or by a request its worker acts on while RUNNING) and,
        when it is cancelled at once, the unfinished children its spawns created, as each
        would be cancelled on its own (docs/jobs-that-wait.md, "Cancelling a waiting job");
        in one statement."""
        result, job = await self._decide(queries.CANCEL, job_id)
        if result is Decision.DONE:
            return Cancelled(job, immediate=job["state"] == JobState.CANCELLED)
        # Refused while RUNNING: the cancel was requested before. The statement decides on
        # the job's newest version, and moves a RUNNING job without the request, so a 202
        # only ever acknowledges a request the job really carries.
        if job["state"] == JobState.RUNNING and job["cancel_requested"]:
            return Cancelled(job, immediate=False)
        if job["state"] == JobState.DLQ:
            raise InvalidState(
                f"job {job_id} is in the DLQ: an admin can retry it or discard it "
                f"(POST /v1/jobs/{job_id}/retry or /discard)"
            )
        raise InvalidState(f"job {job_id} is {job['state']} and cannot be cancelled")

    # -- admin -------------------------------------------------------------------------

    async def retry(self, job_id: UUID) -> JobDict:
        return await self._leave_dlq(job_id, JobState.PENDING, "retried")

    async def discard(self, job_id: UUID) -> JobDict:
        return await self._leave_dlq(job_id, JobState.CANCELLED, "discarded")

    async def _leave_dlq(self, job_id: UUID, to: JobState, verb: str) -> JobDict:
        result, job = await self._decide(queries.LEAVE_DLQ, job_id, to.value)
        if result is Decision.REFUSED:
            raise InvalidState(f"job {job_id} is {job['state']}; only DLQ jobs can be {verb}")
        return job

    async def _decide(
        self,
        query: str,
        job_id: UUID,
        *args: Any,
        within: tuple[asyncpg.Connection, list[Sequence[asyncpg.Record]]] | None = None,
    ) -> tuple[Decision, JobDict]:
        """Run an admin transition on one job; its statement answers in the same round trip
        whether it moved the job or refused it, with the job as it now is. `within`: in the
        caller's transaction on that connection, the hints it owes appended to the list, for
        the caller to settle after its commit."""
        if within is None:
            [row] = await self._change(self._pool, query, job_id, *args)
        else:
            conn, owed = within
            [row] = moved = await self._change(conn, query, job_id, *args, committed=False)
            owed.append(moved)
        result = Decision(row["outcome"])
        if result is Decision.NOT_FOUND:
            raise JobNotFound(f"job {job_id} not found")
        return result, job_from_row(row["job"])

    async def redrive(
        self, queue: str, *, type: str | None = None, limit: int | None = None
    ) -> int:
        """Move DLQ jobs of `queue` back to PENDING in bounded batches (short transactions)."""
        moved = 0
        while limit is None or moved < limit:
            batch = REDRIVE_BATCH if limit is None else min(REDRIVE_BATCH, limit - moved)
            rows = await self._change(self._pool, queries.REDRIVE, queue, type, batch)
            moved += len(rows)
            if len(rows) < batch:
                break
        return moved

    async def pause(self, queue: str) -> None:
        await self._pool.execute(queries.PAUSE_QUEUE, queue)

    async def resume(self, queue: str) -> None:
        await self._pool.execute(queries.RESUME_QUEUE, queue)

    async def paused(self, queues: Sequence[str]) -> set[str]:
        rows = await self._pool.fetch(queries.PAUSED_QUEUES, list(queues))
        return {r["queue"] for r in rows}

    async def all_paused(self) -> list[str]:
        rows = await self._pool.fetch(queries.ALL_PAUSED_QUEUES)
        return [r["queue"] for r in rows]

    # -- workers -----------------------------------------------------------------------

    async def claim(
        self,
        *,
        worker_id: str,
        queues: Sequence[str],
        max_jobs: int = 1,
        types: Sequence[str] | None = None,
    ) -> list[JobDict]:
        args = (list(queues), list(types) if types else None, max_jobs, worker_id)
        # A claim reads its groups' running and pending jobs under its snapshot, and a group's
        # head may change after it was taken (a job put back ahead of the one it picked) and
        # the new head be started (and even suspended) by a claim that commits meanwhile:
        # jobs_group_running, one RUNNING or SUSPENDED job per group, then fails this claim
        # whole, having changed nothing. It lost that group, nothing more: run it again, under
        # a snapshot that shows the group held, for the other jobs it may claim. Each failure
        # is another claim's committed start, so this ends as claims make progress. The same
        # check may wait for a transaction changing the group's running or suspended job,
        # which may wait for a row this claim holds: the claim gives way after a short wait
        # (lock_not_available, evora.claim_jobs() says why) and runs again, having changed
        # nothing. That bound also cuts short a wait for a lock held long (an operator's
        # REINDEX of what the claim reads): the tries share one deadline, so a request's
        # budget (storage/db.py) bounds them all, not each.
        with one_deadline():
            while True:
                try:
                    rows = await self._pool.fetch(queries.CLAIM, *args)
                except asyncpg.UniqueViolationError as exc:
                    if exc.constraint_name != "jobs_group_running":
                        raise
                except asyncpg.LockNotAvailableError:
                    continue
                else:
                    break
        # in the order the claim took them
        rows = sorted(
            rows, key=lambda r: (r["job"]["priority"], r["job"]["run_at"], r["job"]["submit_seq"])
        )
        claimed = [claimed_job_from_row(r["job"]) for r in rows]
        for job, row in zip(claimed, rows, strict=True):
            # only a job that has dependencies: {dependency id: result} of the COMPLETED ones
            if (results := row["dependency_results"]) is not None:
                job["dependency_results"] = dict(results)
        return claimed

    async def traceparents(self, job_ids: Sequence[UUID]) -> dict[UUID, str]:
        """The traceparent each of `job_ids` was submitted with, for those that have one."""
        return await traces.of(self._pool, job_ids)

    async def seconds_until_due(self, queues: Sequence[str]) -> float | None:
        """Seconds until the earliest delayed job of `queues` becomes claimable, if any."""
        due: float | None = await self._pool.fetchval(queries.NEXT_DUE, list(queues))
        return due

    async def heartbeat(
        self,
        job_id: UUID,
        lease_token: UUID,
        *,
        lease_seconds: int | None = None,
        progress: Any = None,
    ) -> Heartbeat:
        row = await self._pool.fetchrow(
            queries.HEARTBEAT, job_id, lease_token, lease_seconds, progress
        )
        assert row is not None  # the statement answers with exactly one row
        AckResult(row["outcome"]).raise_unless_done(job_id)
        return Heartbeat(row["lease_expires_at"], row["cancel_requested"], row["timeout_requested"])

    async def complete(self, job_id: UUID, lease_token: UUID, result: Any = None) -> JobDict:
        return self._single(await self.complete_many([Completion(job_id, lease_token, result)]))

    async def fail(self, failure: Failure) -> JobDict:
        return self._single(await self.fail_many([failure]))

    @staticmethod
    def _single(outcomes: list[AckOutcome]) -> JobDict:
        return outcomes[0].job_or_raise()

    async def complete_many(
        self,
        completions: Sequence[Completion],
        *,
        with_jobs: bool = True,
        brief_lock_waits: bool = False,
    ) -> list[AckOutcome]:
        """Complete a batch in one statement, which also answers each item that changed
        nothing. Repeating a completion that already succeeded with the same token is DONE
        (a worker may retry after a network error). Without `with_jobs` the outcomes carry
        results only, which spares building the jobs. With `brief_lock_waits` the statement
        gives up waiting for a lock at once (see `lock_contended`)."""
        if not completions:
            return []
        rows = await self._ack(
            queries.COMPLETE,
            [c.id for c in completions],
            [c.lease_token for c in completions],
            jsonb_elements(c.result for c in completions),
            with_jobs=with_jobs,
            brief_lock_waits=brief_lock_waits,
        )
        return _outcomes(completions, rows)

    async def settle_completions(
        self,
        ids: Sequence[UUID],
        lease_tokens: Sequence[UUID],
        results: Sequence[orjson.Fragment],
    ) -> list[AckResult]:
        """`complete_many` without the jobs, from columns (each result already encoded, as
        `jsonb_elements` makes them): a worker's batch of acks is answered with one outcome
        per item, and building an object per item on the way cost more than the rest."""
        if not ids:
            return []
        rows = await self._ack(queries.COMPLETE, ids, lease_tokens, results, with_jobs=False)
        return [_ACK_RESULTS[row["outcome"]] for row in rows]

    async def _ack(
        self, query: str, *args: Any, with_jobs: bool, brief_lock_waits: bool = False
    ) -> list[asyncpg.Record]:
        """Run an ack statement, alone. With `brief_lock_waits` (for several independent
        requests) it gives up waiting for a lock at once (`queries.briefly`)."""
        if brief_lock_waits:
            query = queries.briefly(query)
        return await self._change(self._pool, query, *args, with_jobs=with_jobs)

    async def fail_many(
        self, failures: Sequence[Failure], *, with_jobs: bool = True, brief_lock_waits: bool = False
    ) -> list[AckOutcome]:
        """Fail a batch in one statement, answered like complete_many; a repeated failure
        finds the attempt over (LEASE_LOST)."""
        if not failures:
            return []
        rows = await self._ack(
            queries.FAIL,
            [f.id for f in failures],
            [f.lease_token for f in failures],
            [f.error() for f in failures],
            [f.retryable for f in failures],
            [f.retry_in_seconds for f in failures],
            [f.retry_after_key for f in failures],
            with_jobs=with_jobs,
            brief_lock_waits=brief_lock_waits,
        )
        return _outcomes(failures, rows)

    async def release(
        self, job_id: UUID, lease_token: UUID, *, delay_seconds: float = 0.0
    ) -> JobDict:
        return await self._hand_back(job_id, lease_token, delay_seconds, EventName.RELEASED)

    async def snooze(self, job_id: UUID, lease_token: UUID, *, delay_seconds: float) -> JobDict:
        """Hand the job back to run again after `delay_seconds`, without using up an attempt:
        a release recorded as `snoozed` and counted in the job's `snoozes`."""
        return await self._hand_back(job_id, lease_token, delay_seconds, EventName.SNOOZED)

    async def _hand_back(
        self, job_id: UUID, lease_token: UUID, delay_seconds: float, event: EventName
    ) -> JobDict:
        [row] = await self._change(
            self._pool, queries.RELEASE, job_id, lease_token, delay_seconds, str(event)
        )
        AckResult(row["outcome"]).raise_unless_done(job_id)
        return job_from_row(row["job"])

    # -- sweeper -----------------------------------------------------------------------

    async def expire_leases(self, batch: int = EXPIRY_BATCH) -> list[JobDict]:
        rows = await self._change(self._pool, queries.EXPIRE_LEASES, batch)
        return [job_from_row(r["job"]) for r in rows]

    async def time_out(self, batch: int = EXPIRY_BATCH) -> list[JobDict]:
        """Fail the attempts past their job's max_duration_seconds and its grace (reason
        `timeout`, docs/jobs-that-wait.md): one batch, the jobs as they now are."""
        rows = await self._change(self._pool, queries.TIME_OUT, batch)
        return [job_from_row(r["job"]) for r in rows]

    async def suspend(
        self, job_id: UUID, lease_token: UUID, *, timeout_seconds: float, on_timeout: str
    ) -> Suspended:
        """Suspend the RUNNING job on a new callback (docs/callbacks.md): it holds no lease
        and no limit slot until the callback is resolved or times out."""
        [row] = await self._change(
            self._pool, queries.SUSPEND, job_id, lease_token, timeout_seconds, on_timeout
        )
        AckResult(row["outcome"]).raise_unless_done(job_id)
        return Suspended(job_from_row(row["job"]), row["callback_secret"])

    async def spawn_children(
        self,
        job_id: UUID,
        lease_token: UUID,
        submissions: Sequence[JobSubmission],
        *,
        on_dependency_failure: str | None = None,
    ) -> Spawned:
        """Submit the RUNNING job's children and make it wait for them (docs/jobs-that-wait.md),
        in one transaction: all of it or nothing. The parent is locked first under its lease
        (a stale token submits nothing); a cancel requested wins, as for a snooze: the attempt
        ends CANCELLED and no child is submitted. The children are stored as a batch (its
        rules and errors, items named `jobs[i]`); a child that is the parent, or depends on
        it, would wait for it for ever, and one already CANCELLED (a replayed key) under
        on_dependency_failure "cancel" would cancel it at once: refused (InvalidDependency)."""
        owed: list[Sequence[asyncpg.Record]] = []
        async with self._pool.acquire() as conn, conn.transaction():
            [held] = await conn.fetch(queries.HOLD_PARENT, job_id, lease_token)
            AckResult(held["outcome"]).raise_unless_done(job_id)
            children: list[Submitted] = []
            args: tuple[Any, ...]
            if held["cancel_requested"]:
                query, args = queries.RELEASE, (lease_token, 0.0, str(EventName.RELEASED))
            else:
                children, stored = await self._store_children(conn, job_id, submissions)
                owed.append(stored)
                ids = [child.id for child in children]
                query, args = queries.AWAIT_CHILDREN, (ids, on_dependency_failure)
            [row] = moved = await self._change(conn, query, job_id, *args, committed=False)
            if row["outcome"] == "cancelled_dependency":
                raise _cancelled_child(submissions, children, row["cause"])
            owed.append(moved)
            if created := [child.id for child in children if child.created]:
                await conn.execute(queries.RECORD_CHILDREN, job_id, created)
        for rows in owed:
            self._owe(rows)
        return Spawned(job_from_row(row["job"]), children)

    async def _store_children(
        self, conn: asyncpg.Connection, parent: UUID, submissions: Sequence[JobSubmission]
    ) -> tuple[list[Submitted], list[asyncpg.Record]]:
        for index, sub in enumerate(submissions):
            if parent in sub.depends_on:
                raise InvalidDependency(
                    f"jobs[{index}].depends_on[{sub.depends_on.index(parent)}]: a child "
                    "cannot depend on the job that waits for it"
                )
        outcomes, rows = await store(
            conn,
            self._change,
            submissions,
            committed=False,
            name_repeats=True,
            with_jobs=False,
        )
        children: list[Submitted] = []
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, EvoraError):
                raise outcome
            if outcome.id == parent:
                raise InvalidDependency(
                    f"jobs[{index}]: its idempotency key names the job that waits for it"
                )
            children.append(outcome)
        return children, rows

    async def resolve_callback(
        self, callback_id: str | None, payload: Any = None, *, job_id: UUID | None = None
    ) -> dict[str, Any]:
        """Resolve a callback, named by its callback id or (an admin) by the job waiting on
        it; the resolution, the first one's for a repeat."""
        [row] = await self._change(
            self._pool, queries.RESOLVE_CALLBACK, callback_id, job_id, payload
        )
        outcome = row["outcome"]
        if outcome == "not_found":
            if job_id is not None:
                raise InvalidState(f"job {job_id} is not suspended on a callback")
            raise CallbackNotFound("no such callback")
        if outcome == "timed_out":
            raise CallbackSettled("the callback timed out")
        if outcome == "cancelled":
            raise CallbackSettled("the callback's job was cancelled")
        resolution: dict[str, Any] = row["resolution"]
        return resolution

    async def expire_callbacks(self, batch: int = EXPIRY_BATCH) -> list[JobDict]:
        """The sweeper: settle callbacks whose timeout passed, by their on_timeout."""
        rows = await self._change(self._pool, queries.EXPIRE_CALLBACKS, batch)
        return [job_from_row(r["job"]) for r in rows]

    async def expire_ttls(self, batch: int = EXPIRY_BATCH) -> list[JobDict]:
        rows = await self._change(self._pool, queries.EXPIRE_TTLS, batch)
        return [job_from_row(r["job"]) for r in rows]


def _cancelled_child(
    submissions: Sequence[JobSubmission], children: Sequence[Submitted], cause: UUID
) -> InvalidDependency:
    """The refusal of a child whose idempotency key replays a job already CANCELLED, under
    on_dependency_failure "cancel": the waiting job could never run, as for a submission
    naming such a dependency (docs/dependencies.md)."""
    index = next(i for i, child in enumerate(children) if child.id == cause)
    return InvalidDependency(
        f"jobs[{index}]: {submissions[index].idempotency_key!r} names the CANCELLED job "
        f'{cause} (with on_dependency_failure "cancel" this job could never run)'
    )


def _outcomes(
    items: Sequence[Completion | Failure], rows: Sequence[asyncpg.Record]
) -> list[AckOutcome]:
    """The statement answers every item, in order, with its outcome (and its job when DONE
    and asked for)."""
    return [
        AckOutcome(
            item.id,
            AckResult(row["outcome"]),
            None if row["job"] is None else job_from_row(row["job"]),
        )
        for item, row in zip(items, rows, strict=True)
    ]
