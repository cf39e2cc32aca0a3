"""`evora.Worker`: claims jobs from the dispatcher and runs them (CONTRACT sections 5 and 6).

Life of a job in the worker:

1. The claim loop long-polls `POST /v1/claim` for as many jobs as it has free slots.
2. Each job runs in a task of its own, which awaits the handler and then reports how it
   ended. An `async def` handler runs on the event loop; a plain `def` handler runs in one
   of the worker's handler threads (as many as `handler_threads`, by default
   `concurrency`), the task awaiting it there. Every `heartbeat_fraction` of
   `lease_seconds` a heartbeat extends the lease, carries reported progress, and learns
   about cancel requests; a job's heartbeat task starts only when its first heartbeat is
   due (a timer until then), as most jobs end sooner. Heartbeats need nothing but the
   event loop, so an `async` handler that blocks the loop stalls them all: a watchdog
   thread (`blocked_loop_warning`) logs a warning naming that handler.
3. The outcome (complete with the return value, or fail with the exception) goes through
   the `AckBatcher`. The job keeps its slot, and its heartbeats continue, until the
   dispatcher has recorded it, so a slow or briefly unreachable dispatcher does not let the
   lease expire under a finished job.
4. A job whose cancellation was requested sees `job.cancel_event` set; if its handler has not
   ended after `cancel_grace` seconds it is cancelled. A handler that ends with an exception
   (including that cancellation) after a cancel request has its job released, which the
   dispatcher turns into CANCELLED. One that returns normally completes: the work was done.
5. A thread cannot be stopped from outside. A `def` handler checks `job.cancel_requested`
   (or calls `job.raise_if_cancel_requested()`) between steps to stop early. When the
   worker gives up on one still running (the cancel grace or the shutdown grace period
   over, or the lease lost), the job is released (or abandoned) at once as for an async
   handler, the thread runs on, and its eventual result or exception is discarded. Until
   it returns its thread and the job's slot stay taken, so the worker never runs more
   handlers than `concurrency` at once; the threads are daemon threads, so a stopped
   worker process exits without waiting for them.

Shutdown (`stop()`, or SIGTERM/SIGINT under `run()`): the in-flight long-poll is cancelled,
in-flight jobs get `grace_period` seconds to finish, handlers still running after that are
cancelled and their jobs released (a second signal does that at once), outcomes are flushed,
and `serve()` returns. Jobs the dispatcher claims in the very moment the long-poll is
cancelled never reach the worker: a dispatcher that notices the worker left releases them
(Evora's does), otherwise they return to PENDING when their lease expires, as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import logging
import os
import re
import secrets
import signal
import socket
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Literal, TypeVar

import orjson

from evora import loops
from evora.domain.models import QUEUE_PATTERN
from evora.logs import bind
from evora.sdk._http import RETRYABLE_STATUSES, RetryBackoff, Transport, should_retry
from evora.sdk.acks import Ack, AckBatcher
from evora.sdk.errors import (
    EvoraClientError,
    EvoraHTTPError,
    JobNotFoundError,
    LeaseLostError,
)
from evora.sdk.handlers import H, Handler, Handlers, Job, runs_on_loop
from evora.sdk.threads import HandlerThreads
from evora.sdk.watchdog import LoopWatchdog

log = logging.getLogger("evora.worker")

DEFAULT_DISPATCHER_URL: Final = "http://127.0.0.1:8081"
DEFAULT_CONCURRENCY: Final = 10
# Seconds without an event loop tick before the watchdog warns. Well below any lease (the
# default is 60 s, heartbeats go every third of it) so the warning comes before the damage,
# well above what a healthy loop ever takes for one step.
DEFAULT_BLOCKED_LOOP_WARNING: Final = 1.0
MAX_QUEUES: Final = 20
MAX_CLAIM: Final = 500
# With wait_seconds=0 (no long-poll), how long an idle worker waits before asking again.
IDLE_PAUSE_SECONDS: Final = 0.5
# Long enough for any useful message, short enough that a failure report never hits a limit.
MAX_ERROR_MESSAGE: Final = 4096

_QUEUE_RE = re.compile(QUEUE_PATTERN)


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def failure_from_exception(exc: BaseException) -> dict[str, Any]:
    """The `error` of a fail report: retryable unless the exception has a false `retryable`
    attribute (as `NonRetryable` does)."""
    message = str(exc) or type(exc).__name__
    return {
        "message": message[:MAX_ERROR_MESSAGE],
        "type": type(exc).__name__,
        "retryable": bool(getattr(exc, "retryable", True)),
    }


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a `Worker` was configured with; see `Worker` for the meaning."""

    url: str
    token: str | None
    queues: tuple[str, ...]
    concurrency: int
    worker_id: str
    types: tuple[str, ...] | None
    wait_seconds: float
    grace_period: float
    heartbeat_fraction: float
    cancel_grace: float
    ack_linger: float
    ack_batch_size: int
    request_timeout: float
    shutdown_timeout: float
    backoff: RetryBackoff
    handler_threads: int | None = None
    blocked_loop_warning: float | None = DEFAULT_BLOCKED_LOOP_WARNING

    def __post_init__(self) -> None:
        if not 1 <= len(self.queues) <= MAX_QUEUES:
            raise ValueError(f"a worker needs 1..{MAX_QUEUES} queues, got {len(self.queues)}")
        for queue in self.queues:
            if not _QUEUE_RE.fullmatch(queue):
                raise ValueError(f"invalid queue name {queue!r}")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 0 <= self.wait_seconds <= 60:
            raise ValueError("wait_seconds must be 0..60")
        if not 0 < self.heartbeat_fraction < 1:
            raise ValueError("heartbeat_fraction must be between 0 and 1")
        if min(self.grace_period, self.cancel_grace, self.ack_linger) < 0:
            raise ValueError("grace_period, cancel_grace and ack_linger must not be negative")
        if min(self.request_timeout, self.shutdown_timeout) <= 0:
            raise ValueError("request_timeout and shutdown_timeout must be positive")
        if self.handler_threads is not None and self.handler_threads < 1:
            raise ValueError("handler_threads must be at least 1")
        if self.blocked_loop_warning is not None and self.blocked_loop_warning <= 0:
            raise ValueError("blocked_loop_warning must be positive (or None: no watchdog)")


class _Interrupt(StrEnum):
    CANCEL = "cancel requested"
    SHUTDOWN = "shutdown"
    LEASE_LOST = "lease lost"


_Release = Literal["release"]
_Abandon = Literal["abandon"]


@dataclass(eq=False, slots=True)
class _Running:
    """One job and the task running it. The handler runs in that task (or, a sync one, in
    `thread`, which the task awaits), so interrupting the handler cancels the task while
    `in_handler`; `interrupts` counts those cancellations, which the task takes back once
    the handler has ended."""

    job: Job
    task: asyncio.Task[None] = field(init=False)
    in_handler: bool = False
    interrupted: _Interrupt | None = None
    interrupts: int = 0
    # A timer until the first heartbeat is due, then the task sending heartbeats.
    heartbeat: asyncio.TimerHandle | asyncio.Task[None] | None = None
    cancel_timer: asyncio.TimerHandle | None = None
    # A sync handler's call in a handler thread; it may outlive the task.
    thread: Future[Any] | None = None

    def interrupt(self, why: _Interrupt) -> None:
        """Cancel the handler if it still runs; the first reason given is the one acted on."""
        if self.in_handler:
            self.interrupted = self.interrupted or why
            self.interrupts += 1
            self.task.cancel()

    def give_up(self) -> None:
        """Cancel the task whatever it waits for, and stop its timers at once: a handler that
        ignores cancellation keeps the task alive, but it reports nothing when it ends."""
        self.stop_timers()
        self.task.cancel()

    def stop_timers(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.cancel()
        if self.cancel_timer is not None:
            self.cancel_timer.cancel()

    def outcome(
        self, result: Any, error: BaseException | None, cancelled: bool
    ) -> Ack | _Release | _Abandon:
        """What to tell the dispatcher once the handler has ended."""
        job = self.job
        if self.interrupted is _Interrupt.LEASE_LOST:
            return "abandon"
        if cancelled or error is not None:
            if self.interrupted is not None or job.cancel_requested:
                return "release"
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
            return Ack(job.id, job.lease_token, "fail", error=failure)
        try:
            encoded = orjson.Fragment(orjson.dumps(result))
        except TypeError as exc:
            # Deterministic: running the handler again would return the same thing.
            log.error("job %s: the handler's result is not JSON-serialisable: %s", job.id, exc)
            message = f"the handler's result is not JSON-serialisable: {exc}"
            error_body = {"message": message, "type": type(exc).__name__, "retryable": False}
            return Ack(job.id, job.lease_token, "fail", error=error_body)
        return Ack(job.id, job.lease_token, "complete", result=encoded)


class Worker:
    """Runs handlers for jobs claimed from the dispatcher at `url` (role `worker` token).

    - `queues`: 1..20 queue names to claim from; `concurrency`: handlers running at once.
    - `types`: job types to claim; defaults to the types with a registered handler.
    - `handlers`: a `Handlers` registry to start from; `@worker.handler(type)` adds more.
    - `wait_seconds`: how long one claim long-polls (0..60).
    - `grace_period`: on stop, how long in-flight jobs may still run before being released.
    - `heartbeat_fraction`: heartbeat every this fraction of the job's `lease_seconds`.
    - `cancel_grace`: after a cancel request, how long a handler may take to stop on its
      own before it is cancelled.
    - `ack_linger`, `ack_batch_size`: outcome batching (see `evora.sdk.acks`). Up to 500
      outcomes a request by default, as many as one claim hands out: large acks are what
      lets a busy worker record a batch in one statement (docs/benchmarks.md).
    - `request_timeout`: bound of every call but the long-poll (which gets `wait_seconds`
      more); `shutdown_timeout`: bound of releasing and reporting after the grace period.
    - `backoff`: between failed claims or outcome reports, e.g. while the dispatcher
      restarts.
    - `handler_threads`: how many plain `def` handlers may run at once, each in a thread
      of its own (default: `concurrency`).
    - `blocked_loop_warning`: warn when the event loop has not run for this many seconds,
      naming the handler that blocks it (None: no watchdog).
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        queues: Sequence[str] = (),
        concurrency: int = DEFAULT_CONCURRENCY,
        *,
        handlers: Handlers | None = None,
        worker_id: str | None = None,
        types: Sequence[str] | None = None,
        wait_seconds: float = 20.0,
        grace_period: float = 30.0,
        heartbeat_fraction: float = 1 / 3,
        cancel_grace: float = 5.0,
        ack_linger: float = 0.005,
        ack_batch_size: int = 500,
        request_timeout: float = 10.0,
        shutdown_timeout: float = 10.0,
        backoff: RetryBackoff | None = None,
        handler_threads: int | None = None,
        blocked_loop_warning: float | None = DEFAULT_BLOCKED_LOOP_WARNING,
    ) -> None:
        if isinstance(queues, str):
            raise TypeError("queues must be a list of queue names, not a string")
        settings = WorkerSettings(
            url=url,
            token=token,
            queues=tuple(queues),
            concurrency=concurrency,
            worker_id=worker_id or default_worker_id(),
            types=None if types is None else tuple(types),
            wait_seconds=wait_seconds,
            grace_period=grace_period,
            heartbeat_fraction=heartbeat_fraction,
            cancel_grace=cancel_grace,
            ack_linger=ack_linger,
            ack_batch_size=ack_batch_size,
            request_timeout=request_timeout,
            shutdown_timeout=shutdown_timeout,
            backoff=backoff or RetryBackoff(initial=0.5, max_delay=30.0),
            handler_threads=handler_threads,
            blocked_loop_warning=blocked_loop_warning,
        )
        self._setup(settings, handlers or Handlers())

    def _setup(self, settings: WorkerSettings, handlers: Handlers) -> None:
        self.settings = settings
        self.handlers = handlers
        # Connections are bounded by the jobs held (one heartbeat each) plus claim, acks and
        # releases, so the pool needs no limit of its own that could stall heartbeats.
        self._http = Transport(
            settings.url,
            settings.token,
            timeout=settings.request_timeout,
            retries=3,
            backoff=RetryBackoff(),
            connection_limit=0,
        )
        self._acks = AckBatcher(
            self._send_acks,
            max_batch=settings.ack_batch_size,
            linger=settings.ack_linger,
            expect_more=lambda: self._handlers > 0,
            backoff=settings.backoff,
        )
        # Slots stay taken until a job's outcome is recorded, not just until its handler
        # returns: otherwise claims outrun acks under a backlog, unacked outcomes pile up and
        # their leases can expire under finished jobs. `_handlers` counts those still running.
        self._busy = 0
        self._handlers = 0
        self._running: set[_Running] = set()
        self._slot_freed = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._stopped = asyncio.Event()
        self._claim_task: asyncio.Task[None] | None = None
        self._started = False
        self._threads = HandlerThreads(
            settings.handler_threads or settings.concurrency, name="evora-handler"
        )
        self._watchdog = (
            None
            if settings.blocked_loop_warning is None
            else LoopWatchdog(settings.blocked_loop_warning, self._describe_task)
        )

    def _reconfigured(
        self,
        *,
        url: str | None = None,
        token: str | None = None,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
    ) -> Worker:
        """A copy of this (not yet started) worker with some settings replaced."""
        changes: dict[str, Any] = {}
        if url is not None:
            changes["url"] = url
        if token is not None:
            changes["token"] = token
        if queues:
            changes["queues"] = tuple(queues)
        if concurrency is not None:
            changes["concurrency"] = concurrency
        worker = Worker.__new__(Worker)
        worker._setup(dataclasses.replace(self.settings, **changes), self.handlers)
        return worker

    def handler(self, type: str) -> Callable[[H], H]:
        """Decorator registering a handler for jobs of `type`: an `async def` runs on the
        event loop and must never block it; a plain `def` runs in a handler thread."""
        return self.handlers.job(type)

    def run(self) -> None:
        """Serve until SIGTERM or SIGINT, then shut down gracefully (a second signal skips the
        rest of the grace period). Blocks; runs its own event loop (see `evora.loops`)."""
        loops.run(self._serve_until_signalled())

    async def _serve_until_signalled(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            await self.serve()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stop_requested.is_set():
            log.warning("%s again: releasing the jobs still running", sig.name)
            self._interrupt_all()
        else:
            log.info("%s: stopping (grace period %.0fs)", sig.name, self.settings.grace_period)
            self._request_stop()

    async def stop(self) -> None:
        """Stop claiming, give in-flight jobs the grace period, release the rest; returns when
        `serve()` has finished (at once if it never started, and then it will not)."""
        self._request_stop()
        if self._started:
            await self._stopped.wait()

    def _request_stop(self) -> None:
        self._stop_requested.set()
        if self._claim_task is not None:
            self._claim_task.cancel()

    def _interrupt_all(self) -> None:
        for running in self._running:
            running.interrupt(_Interrupt.SHUTDOWN)

    async def serve(self) -> None:
        """Claim and run jobs until `stop()`; for use inside a running event loop.

        Raises the `EvoraHTTPError` with which the dispatcher refuses to hand out jobs at all
        (a wrong token or role, invalid queue names), after shutting down as on `stop()`.
        Claims that fail for a while (dispatcher down or restarting) are retried with
        backoff and logged. A Worker serves once."""
        types = list(self.settings.types or self.handlers.types)
        if not types:
            raise ValueError("no handlers registered and no types given: nothing to claim")
        if self._started:
            raise RuntimeError("this Worker has already served; create a new one")
        self._started = True
        self._acks.start()
        if self._watchdog is not None:
            self._watchdog.start()
        log.info(
            "worker %s claiming %s from queues %s at %s, concurrency %d",
            self.settings.worker_id,
            ", ".join(types),
            ", ".join(self.settings.queues),
            self.settings.url,
            self.settings.concurrency,
        )
        self._claim_task = asyncio.create_task(self._claim_loop(types), name="evora-claims")
        if self._stop_requested.is_set():
            self._claim_task.cancel()
        try:
            await self._claim_task
        except asyncio.CancelledError:
            if not self._stop_requested.is_set():
                # serve() itself was cancelled: shut down without waiting out the grace.
                self._stop_requested.set()
                self._interrupt_all()
                raise
        finally:
            await self._shutdown()

    async def _claim_loop(self, types: list[str]) -> None:
        failures = 0
        while True:
            while self._busy >= self.settings.concurrency:
                self._slot_freed.clear()
                await self._slot_freed.wait()
            try:
                jobs = await self._claim(
                    types, min(self.settings.concurrency - self._busy, MAX_CLAIM)
                )
            except EvoraClientError as exc:
                if isinstance(exc, EvoraHTTPError) and exc.status < 500 and exc.status != 429:
                    log.error("the dispatcher refuses to hand out jobs: %s", exc)
                    raise
                failures += 1
                delay = self.settings.backoff.delay(failures)
                log.warning("claim failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            if failures:
                log.info("claiming again after %d failed attempts", failures)
                failures = 0
            for data in jobs:
                self._start(data)
            if not jobs and self.settings.wait_seconds == 0:
                # Without a long-poll an empty queue would be asked again at once, forever.
                await asyncio.sleep(IDLE_PAUSE_SECONDS)

    async def _claim(self, types: list[str], max_jobs: int) -> list[dict[str, Any]]:
        body = {
            "worker_id": self.settings.worker_id,
            "queues": list(self.settings.queues),
            "max_jobs": max_jobs,
            "wait_seconds": self.settings.wait_seconds,
            "types": types,
        }
        # Not repeated by the transport: a repeat after a lost answer would claim other jobs
        # while the first ones wait for their leases to expire. The loop claims afresh.
        resp = await self._http.request(
            "POST",
            "/v1/claim",
            body=body,
            idempotent=False,
            retries=0,
            time_limit=self.settings.wait_seconds + self.settings.request_timeout,
        )
        jobs: list[dict[str, Any]] = resp.data["jobs"]
        return jobs

    def _start(self, data: Mapping[str, Any]) -> None:
        job = Job.from_claim(data)
        running = _Running(job)
        self._busy += 1
        running.task = asyncio.get_running_loop().create_task(
            self._process(running, self.handlers.get(job.type)), name=f"evora-job-{job.id}"
        )
        self._running.add(running)

    async def _process(self, running: _Running, handler: Handler | None) -> None:
        job = running.job
        # This task runs in a copy of the context, so nothing needs unbinding. Its records,
        # the handler's and the heartbeats' say which job.
        bind(job_id=job.id, queue=job.queue, job_type=job.type)
        interval = job.lease_seconds * self.settings.heartbeat_fraction
        # Most jobs end long before their first heartbeat: a timer is cheaper than a task.
        running.heartbeat = asyncio.get_running_loop().call_later(
            interval, self._start_heartbeats, running, interval
        )
        try:
            outcome = await self._execute(running, handler)
            if outcome == "release":
                await self._release(job)
            elif isinstance(outcome, Ack):
                await self._report(outcome)
        except EvoraClientError as exc:
            log.error(
                "job %s: could not tell the dispatcher how it ended (%s); it will run again "
                "when its lease expires",
                job.id,
                exc,
            )
        finally:
            running.stop_timers()
            self._running.discard(running)
            if running.thread is not None and not running.thread.done():
                self._free_slot_when_done(running)
            else:
                self._free_slot()

    def _free_slot(self) -> None:
        self._busy -= 1
        self._slot_freed.set()

    def _free_slot_when_done(self, running: _Running) -> None:
        """The job is over for the worker but its sync handler still runs: its thread keeps
        the slot, so abandoned threads never add up to more than `concurrency`."""
        assert running.thread is not None
        log.warning(
            "job %s: its handler %s is still running in a thread, which cannot be stopped; "
            "whatever it returns will be discarded",
            running.job.id,
            _name_of(self.handlers.get(running.job.type)),
        )
        loop = asyncio.get_running_loop()

        def done(_: Future[Any]) -> None:
            # In the handler thread. A closed loop means the worker is gone: no slot to free.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._free_slot)

        running.thread.add_done_callback(done)

    async def _execute(
        self, running: _Running, handler: Handler | None
    ) -> Ack | _Release | _Abandon:
        job = running.job
        if handler is None:
            # Retryable: another worker of the fleet may know the type.
            log.error("job %s: no handler for type %r", job.id, job.type)
            message = f"worker {self.settings.worker_id} has no handler for {job.type!r}"
            error = {"message": message, "type": "UnknownJobType", "retryable": True}
            return Ack(job.id, job.lease_token, "fail", error=error)
        result: Any = None
        failure: BaseException | None = None
        cancelled = False
        self._handlers += 1
        running.in_handler = True
        try:
            if runs_on_loop(handler):
                result = await handler(job)
            else:
                running.thread = self._threads.submit(lambda: handler(job))
                # Cancelling this await (an interrupt) leaves the thread running.
                result = await asyncio.wrap_future(running.thread)
        except asyncio.CancelledError:
            cancelled = True
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise  # the process or this coroutine ends, not just the handler
        except BaseException as exc:
            failure = exc
        finally:
            running.in_handler = False
            self._handlers -= 1
        task = running.task
        for _ in range(running.interrupts):
            task.uncancel()
        if task.cancelling():
            # Cancelled by someone else (shutdown giving up, or asyncio.run ending): nothing
            # is reported, whatever the handler did with the cancellation.
            raise asyncio.CancelledError
        return running.outcome(result, failure, cancelled)

    def _start_heartbeats(self, running: _Running, interval: float) -> None:
        running.heartbeat = asyncio.get_running_loop().create_task(
            self._heartbeat(running, interval), name=f"evora-hb-{running.job.id}"
        )

    async def _heartbeat(self, running: _Running, interval: float) -> None:
        job = running.job
        loop = asyncio.get_running_loop()
        while True:
            # Every `delay` from one send to the next, however long the answer took.
            sent_at = loop.time()
            delay = interval
            body: dict[str, Any] = {"lease_token": job.lease_token}
            progress = job._take_progress()
            if progress is not None:
                body["progress"] = progress
            try:
                resp = await self._http.request(
                    "POST",
                    f"/v1/jobs/{job.id}/heartbeat",
                    body=body,
                    idempotent=True,
                    retries=0,
                    time_limit=min(interval, self.settings.request_timeout),
                )
            except (LeaseLostError, JobNotFoundError) as exc:
                log.warning("job %s: %s; abandoning it", job.id, exc)
                running.interrupt(_Interrupt.LEASE_LOST)
                return
            except EvoraClientError as exc:
                if should_retry(exc, idempotent=True):
                    if progress is not None:
                        job._restore_progress(progress)
                    # Sooner than usual: the lease keeps running out meanwhile.
                    delay = interval / 4
                log.warning("job %s: heartbeat failed: %s", job.id, exc)
            else:
                if resp.data.get("cancel_requested") and not job.cancel_requested:
                    self._on_cancel_requested(running)
            await asyncio.sleep(max(0.0, sent_at + delay - loop.time()))

    def _on_cancel_requested(self, running: _Running) -> None:
        running.job.cancel_event.set()
        if running.in_handler:
            log.info(
                "job %s: cancellation requested; the handler has %.1fs to stop",
                running.job.id,
                self.settings.cancel_grace,
            )
            running.cancel_timer = asyncio.get_running_loop().call_later(
                self.settings.cancel_grace, running.interrupt, _Interrupt.CANCEL
            )

    async def _release(self, job: Job) -> None:
        try:
            await self._http.request(
                "POST",
                f"/v1/jobs/{job.id}/release",
                body={"lease_token": job.lease_token},
                idempotent=True,
            )
        except (LeaseLostError, JobNotFoundError) as exc:
            log.info("job %s: nothing to release (%s)", job.id, exc)
            return
        log.info("job %s released", job.id)

    async def _report(self, ack: Ack) -> None:
        status = await self._acks.submit(ack)
        if status == 409:
            log.warning(
                "job %s: its lease was lost before the outcome was recorded; the job was "
                "taken away (another attempt owns it now)",
                ack.job_id,
            )
        elif status == 404:
            log.warning("job %s no longer exists; its outcome was dropped", ack.job_id)
        elif status != 200:
            log.error("job %s: the dispatcher answered %d to its outcome", ack.job_id, status)

    async def _send_acks(self, acks: Sequence[Ack]) -> dict[str, int]:
        try:
            resp = await self._http.request(
                "POST",
                "/v1/acks",
                body={"acks": [ack.item() for ack in acks]},
                idempotent=True,
                retries=0,
            )
        except EvoraHTTPError as exc:
            if exc.status in RETRYABLE_STATUSES:
                raise
            # One bad item (a result over the size limit, say) must not sink the others.
            log.warning(
                "the dispatcher rejected a batch of %d outcomes (%s); sending them one by one",
                len(acks),
                exc,
            )
            return {ack.job_id: await self._send_one(ack) for ack in acks}
        statuses = {str(item["id"]): int(item["status"]) for item in resp.data["results"]}
        missing = [ack.job_id for ack in acks if ack.job_id not in statuses]
        if missing:
            raise EvoraClientError(f"the dispatcher's answer lacks jobs {', '.join(missing)}")
        return statuses

    async def _send_one(self, ack: Ack) -> int:
        try:
            await self._http.request(
                "POST",
                f"/v1/jobs/{ack.job_id}/{ack.outcome}",
                body=ack.endpoint_body(),
                idempotent=True,
                retries=0,
            )
        except EvoraHTTPError as exc:
            if exc.status in RETRYABLE_STATUSES:
                raise
            if exc.status in (404, 409):
                return exc.status
            if ack.outcome == "complete":
                log.error("job %s: the dispatcher rejected its result (%s)", ack.job_id, exc)
                message = f"the dispatcher rejected the result: {exc}"[:MAX_ERROR_MESSAGE]
                error = {"message": message, "type": type(exc).__name__, "retryable": False}
                return await self._send_one(Ack(ack.job_id, ack.lease_token, "fail", error=error))
            log.error("job %s: the dispatcher rejected its failure report (%s)", ack.job_id, exc)
            return exc.status
        return 200

    async def _shutdown(self) -> None:
        self._stop_requested.set()
        try:
            if self._running:
                log.info(
                    "waiting up to %.0fs for %d jobs to finish",
                    self.settings.grace_period,
                    len(self._running),
                )
                await self._wait_running(self.settings.grace_period)
                self._interrupt_all()
                await self._wait_running(self.settings.shutdown_timeout)
            if self._running:
                log.error("giving up on %d jobs; their leases will expire", len(self._running))
                for running in self._running:
                    running.give_up()
                # A handler that ignores cancellation keeps its task alive: waiting for it
                # would keep serve() from returning.
                tasks = {running.task for running in self._running if not running.in_handler}
                if tasks:
                    await asyncio.wait(tasks)
            # Every outcome a job task waited for has been sent; what is left belongs to
            # tasks given up on just now, so this is a last, short chance.
            await self._acks.close(within=1.0)
            await self._http.close()
        finally:
            self._threads.close()
            if self._watchdog is not None:
                self._watchdog.stop()
            self._stopped.set()
        log.info("worker %s stopped", self.settings.worker_id)

    async def _wait_running(self, seconds: float) -> None:
        tasks = {running.task for running in self._running}
        if tasks:
            await asyncio.wait(tasks, timeout=seconds)

    def _describe_task(self, task: asyncio.Task[Any] | None) -> str:
        """For the watchdog, in its thread: which job's handler `task` runs."""
        if task is None:
            return "a callback outside any task"
        # A copy first: the set may change on the loop meanwhile (copying takes no turns).
        for running in tuple(self._running):
            if running.task is task:
                job = running.job
                return (
                    f"job {job.id} (type {job.type!r}, handler "
                    f"{_name_of(self.handlers.get(job.type))})"
                )
        return f"task {task.get_name()!r}, which runs no job's handler"


def _name_of(handler: Handler | None) -> str:
    name = getattr(handler, "__qualname__", None) or repr(handler)
    module = inspect.getmodule(handler)
    return f"{module.__name__}.{name}" if module is not None else name


# `evora worker MODULE`

ENV_DISPATCHER_URL: Final = "EVORA_DISPATCHER_URL"
ENV_WORKER_TOKEN: Final = "EVORA_WORKER_TOKEN"
ENV_WORKER_QUEUES: Final = "EVORA_WORKER_QUEUES"
ENV_WORKER_CONCURRENCY: Final = "EVORA_WORKER_CONCURRENCY"


class WorkerLoadError(Exception):
    """MODULE cannot give a worker; the message is one human-readable line."""


_T = TypeVar("_T")


def _instances(values: Iterable[object], cls: type[_T]) -> list[_T]:
    # By identity: a module may hold the same object under two names.
    return list({id(value): value for value in values if isinstance(value, cls)}.values())


def load_worker(
    module_name: str,
    *,
    url: str | None = None,
    token: str | None = None,
    queues: Sequence[str] | None = None,
    concurrency: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> Worker:
    """The worker `evora worker MODULE` runs; see `run_worker_from_module`."""
    # Like `python -m`: a module next to where the command runs is importable.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name + ".").startswith(exc.name + "."):
            raise WorkerLoadError(f"cannot import {module_name}: {exc}") from exc
        raise
    values = list(vars(module).values())
    try:
        worker = _worker_from(module_name, values, url, token, queues, concurrency, environ)
    except ValueError as exc:
        raise WorkerLoadError(str(exc)) from exc
    if not (worker.settings.types or worker.handlers.types):
        raise WorkerLoadError(f"{module_name} registers no handlers")
    return worker


def _worker_from(
    module_name: str,
    values: list[object],
    url: str | None,
    token: str | None,
    queues: Sequence[str] | None,
    concurrency: int | None,
    environ: Mapping[str, str] | None,
) -> Worker:
    workers = _instances(values, Worker)
    if len(workers) > 1:
        raise WorkerLoadError(f"{module_name} defines {len(workers)} evora.Worker objects")
    if workers:
        return workers[0]._reconfigured(
            url=url, token=token, queues=queues, concurrency=concurrency
        )
    registries = _instances(values, Handlers)
    if not registries:
        raise WorkerLoadError(f"{module_name} defines no evora.Worker and no evora.Handlers")
    handlers = Handlers()
    for registry in registries:
        handlers.include(registry)
    env = os.environ if environ is None else environ
    queue_names = queues or [q.strip() for q in env.get(ENV_WORKER_QUEUES, "").split(",")]
    queue_names = [name for name in queue_names if name]
    if not queue_names:
        raise WorkerLoadError(f"no queues given: pass them or set {ENV_WORKER_QUEUES}")
    if concurrency is None:
        raw = env.get(ENV_WORKER_CONCURRENCY, "").strip()
        if raw and not raw.isdigit():
            raise WorkerLoadError(f"{ENV_WORKER_CONCURRENCY} must be an integer, got {raw!r}")
        concurrency = int(raw) if raw else DEFAULT_CONCURRENCY
    return Worker(
        url or env.get(ENV_DISPATCHER_URL) or DEFAULT_DISPATCHER_URL,
        token or env.get(ENV_WORKER_TOKEN) or None,
        queue_names,
        concurrency,
        handlers=handlers,
    )


def run_worker_from_module(
    module_name: str,
    *,
    url: str | None,
    token: str | None,
    queues: list[str] | None,
    concurrency: int | None,
) -> int:
    """Run the worker MODULE defines until SIGTERM/SIGINT; the exit status is returned.

    MODULE is imported (the current directory is importable, as with `python -m`), then:

    - if it holds an `evora.Worker`, that worker runs, with `url`, `token`, `queues` and
      `concurrency` replacing its own settings where given (not None);
    - otherwise its `evora.Handlers` registries (all of them, merged) are run by a new
      worker configured from the arguments, else from the environment:
      `EVORA_DISPATCHER_URL` (default http://127.0.0.1:8081), `EVORA_WORKER_TOKEN`,
      `EVORA_WORKER_QUEUES` (comma-separated, required one way or the other) and
      `EVORA_WORKER_CONCURRENCY` (default 10).

    Returns 0 after a graceful stop, 1 when the dispatcher refused the worker (bad token,
    say), 2 when MODULE gives no runnable worker; problems are printed on one line to
    stderr.
    """
    try:
        worker = load_worker(
            module_name, url=url, token=token, queues=queues, concurrency=concurrency
        )
    except WorkerLoadError as exc:
        print(f"evora worker: {exc}", file=sys.stderr)
        return 2
    try:
        worker.run()
    except EvoraClientError as exc:
        print(f"evora worker: {exc}", file=sys.stderr)
        return 1
    return 0
