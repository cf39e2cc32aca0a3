"""One job inside the worker: the task running it, what may interrupt its handler, and what
the worker tells the dispatcher once the handler has ended."""

from __future__ import annotations

import asyncio
import logging
import traceback
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final, Literal

import orjson

from evora.protocol.bounds import MAX_ERROR_MESSAGE, MAX_ERROR_TRACEBACK
from evora.sdk.acks import Ack
from evora.sdk.errors import RetryAfter, Snooze
from evora.sdk.handlers import Job

if TYPE_CHECKING:
    from evora.sdk.heartbeats import FirstBeat

log = logging.getLogger("evora.worker")

# The result of a handler that returns nothing, as many do: encoded once, not per job.
_NULL = orjson.Fragment(b"null")


def failure_from_exception(exc: BaseException) -> dict[str, Any]:
    """The `error` of a fail report: retryable unless the exception has a false `retryable`
    attribute (as `NonRetryable` does)."""
    message = str(exc) or type(exc).__name__
    return {
        "message": message[:MAX_ERROR_MESSAGE],
        "type": type(exc).__name__,
        "retryable": bool(getattr(exc, "retryable", True)),
        # the innermost frames, where the error was raised, are the end of the trace
        "traceback": "".join(traceback.format_exception(exc))[-MAX_ERROR_TRACEBACK:],
    }


# How a worker fails an attempt it stopped past the job's max_duration_seconds: the error
# type the sweeper's timeout writes too (docs/jobs-that-wait.md), retried per the job's policy.
TIMEOUT_ERROR: Final = {
    "message": "the attempt ran past max_duration_seconds; the worker stopped it",
    "type": "timeout",
    "retryable": True,
}


class Interrupt(StrEnum):
    CANCEL = "cancel requested"
    TIMEOUT = "past max_duration_seconds"
    SHUTDOWN = "shutdown"
    LEASE_LOST = "lease lost"


Release = Literal["release"]
Abandon = Literal["abandon"]
# The handler suspended the job on a callback (`Job.suspend`) or made it wait for children
# (`Job.spawn_children`): the attempt left the worker then, so there is nothing to report.
Suspended = Literal["suspended"]


@dataclass(frozen=True, slots=True)
class Snoozed:
    """The handler raised `Snooze`: hand the job back to run again in `seconds`."""

    seconds: float


@dataclass(eq=False, slots=True)
class RunningJob:
    """One job and the task running it. The handler runs in that task (or, a sync one, in
    `thread`, which the task awaits), so interrupting the handler cancels the task while
    `in_handler`; `interrupts` counts those cancellations, which the task takes back once
    the handler has ended."""

    job: Job
    task: asyncio.Task[None] = field(init=False)
    in_handler: bool = False
    # Claimed ahead (the worker's `prefetch`) and waiting for a slot to run in.
    waiting: bool = False
    interrupted: Interrupt | None = None
    interrupts: int = 0
    # The claim's jobs waiting for their first heartbeat, then the task sending heartbeats.
    first_beat: FirstBeat | None = None
    heartbeat: asyncio.Task[None] | None = None
    cancel_timer: asyncio.TimerHandle | None = None
    # A sync handler's call in a handler thread; it may outlive the task.
    thread: Future[Any] | None = None
    # Whether the job still counts against the worker's concurrency.
    holds_slot: bool = True

    def interrupt(self, why: Interrupt) -> None:
        """Cancel the handler if it still runs, or the wait for a slot of a job claimed ahead
        (which then never runs); the first reason given is the one acted on."""
        if self.in_handler or self.waiting:
            self.interrupted = self.interrupted or why
            self.interrupts += 1
            self.task.cancel()

    def give_up(self) -> None:
        """Cancel the task whatever it waits for, and stop its timers at once: a handler that
        ignores cancellation keeps the task alive, but it reports nothing when it ends."""
        self.stop_timers()
        self.task.cancel()

    def stop_timers(self) -> None:
        if self.first_beat is not None:
            self.first_beat.leave(self)
            self.first_beat = None
        if self.heartbeat is not None:
            self.heartbeat.cancel()
        if self.cancel_timer is not None:
            self.cancel_timer.cancel()

    def outcome(
        self, result: Any, error: BaseException | None, cancelled: bool
    ) -> Ack | Release | Abandon | Snoozed | Suspended:
        """What to tell the dispatcher once the handler has ended."""
        job = self.job
        if job.left_worker:
            if error is not None or result is not None:
                log.warning(
                    "job %s: suspended or waiting for children, so what its handler %s is dropped",
                    job.id,
                    "raised" if error is not None else "returned",
                )
            return "suspended"
        if self.interrupted is Interrupt.LEASE_LOST:
            return "abandon"
        if cancelled or error is not None:
            if job.timeout_requested:
                # Failed, not handed back: a release would not count the attempt, and the
                # job would run past its limit attempt after attempt.
                log.warning("job %s (%s) stopped: past its max_duration_seconds", job.id, job.type)
                return Ack(job.id, job.lease_token, "fail", error=dict(TIMEOUT_ERROR))
            if self.interrupted is not None or job.cancel_requested:
                return "release"
            if isinstance(error, Snooze):
                return Snoozed(error.seconds)
            failure = failure_from_exception(error or asyncio.CancelledError())
            log.warning(
                "job %s (%s, attempt %d of %d) failed: %s",
                job.id,
                job.type,
                job.attempt,
                job.max_attempts,
                failure["message"],
                exc_info=error,
            )
            if isinstance(error, RetryAfter):
                after = {"limit_key": error.limit_key, "seconds": error.seconds}
                return Ack(job.id, job.lease_token, "fail", error=failure, retry_after=after)
            return Ack(job.id, job.lease_token, "fail", error=failure)
        try:
            encoded = _NULL if result is None else orjson.Fragment(orjson.dumps(result))
        except TypeError as exc:
            # Deterministic: running the handler again would return the same thing.
            log.error("job %s: the handler's result is not JSON-serialisable: %s", job.id, exc)
            message = f"the handler's result is not JSON-serialisable: {exc}"
            error_body = {"message": message, "type": type(exc).__name__, "retryable": False}
            return Ack(job.id, job.lease_token, "fail", error=error_body)
        return Ack(job.id, job.lease_token, "complete", result=encoded)
