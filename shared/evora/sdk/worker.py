"""`evora.Worker`: claims jobs from the dispatcher and runs them (docs/http-api.md#worker-api).

Life of a job in the worker:

1. The claim loop long-polls `POST /v1/claim` for as many jobs as it has free slots. With
   `prefetch`, it also claims up to that many jobs more than it can run, each claim for at
   most `concurrency`; those wait in the worker (leased, heartbeated) for a slot, so a slot
   that frees starts the next job at once instead of after a claim's round trip. A job held
   so that is cancelled, or whose lease is lost, never runs (released, or abandoned); on
   stop, held jobs are released at once.
2. Each job runs in a task of its own, which awaits the handler and then reports how it
   ended. An `async def` handler runs on the event loop; a plain `def` handler runs in one
   of the worker's handler threads (as many as `handler_threads`, by default
   `concurrency`), the task awaiting it there. Every `heartbeat_fraction` of
   `lease_seconds` a heartbeat extends the lease, carries reported progress, and learns
   about cancel requests; a job's heartbeat task starts only when its first heartbeat is
   due (one timer for the jobs of a claim until then), as most jobs end sooner. Heartbeats
   need nothing but the event loop, so an `async` handler that blocks the loop stalls them
   all: a watchdog thread (`blocked_loop_warning`) logs a warning naming that handler.
3. The outcome (complete with the return value, or fail with the exception) goes through
   the `AckBatcher`. The job's heartbeats continue until the dispatcher has recorded it, so
   a slow or briefly unreachable dispatcher does not let the lease expire under a finished
   job. Its slot is freed when the outcome goes out in a batch: the next claim then runs
   while that batch is on its way instead of after it (a drained batch costs one round trip
   of latency, not two), and as the batcher sends one batch at a time, finished jobs whose
   outcomes are not yet recorded never number more than twice `concurrency`. When the
   claim loop is waiting for exactly those slots (all were taken, as in a drain), the batch
   rides in that claim's `acks` (one request, not two); otherwise (a claim already
   long-polling, or shutting down) it goes by `POST /v1/acks` and waits for nothing.
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

The parts live in modules of their own: `settings` (defaults and checks), `running` (one
job's task, interrupts and outcome), `executor` (running handlers, threads included),
`heartbeats`, `reports` (outcomes and releases to the dispatcher) and `loading`
(`evora worker MODULE`); this module claims jobs and runs each through those parts.

Shutdown (`stop()`, or SIGTERM/SIGINT under `run()`): the in-flight long-poll is cancelled,
in-flight jobs get `grace_period` seconds to finish, handlers still running after that are
cancelled and their jobs released (a second signal does that at once), outcomes are flushed,
and `serve()` returns. Jobs the dispatcher claims in the very moment the long-poll is
cancelled never reach the worker: a dispatcher that notices the worker left releases them
(Evora's does), otherwise they return to PENDING when their lease expires, as after a crash.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import random
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from evora import collector, loops
from evora.logs import bind, configure_default_logging
from evora.protocol.bounds import MAX_CLAIM_JOBS
from evora.protocol.retries import RetryBackoff
from evora.sdk._http import Transport
from evora.sdk.acks import Ack
from evora.sdk.errors import (
    EvoraClientError,
    EvoraConnectionError,
    EvoraHTTPError,
    JobCancelled,
)
from evora.sdk.executor import Executor
from evora.sdk.handlers import H, Handler, Handlers, Job, WorkerLink
from evora.sdk.heartbeats import Heartbeats
from evora.sdk.reports import Reports
from evora.sdk.running import Interrupt, RunningJob, Snoozed
from evora.sdk.settings import (
    DEFAULT_BLOCKED_LOOP_WARNING,
    DEFAULT_CONCURRENCY,
    IDLE_PAUSE_SECONDS,
    READY_PROBE_SECONDS,
    WorkerSettings,
    default_worker_id,
)
from evora.sdk.threads import when_thread_done
from evora.sdk.tracing import job_trace
from evora.sdk.watchdog import LoopWatchdog

if TYPE_CHECKING:
    from evora.sdk.client import Submission

log = logging.getLogger("evora.worker")


@dataclasses.dataclass(frozen=True)
class _Carried:
    """Outcomes (items of `POST /v1/acks`) riding in the next claim, and where its answer
    for them goes."""

    acks: list[dict[str, Any]]
    answer: asyncio.Future[list[dict[str, Any]]]


class Worker:
    """Runs handlers for jobs claimed from the dispatcher at `url` (role `worker` token).

    - `queues`: 1..20 queue names to claim from; `concurrency`: handlers running at once.
    - `prefetch`: jobs held claimed beyond `concurrency`, each waiting for a free slot
      (module notes, step 1); 0, the default, claims for free slots only.
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
        prefetch: int = 0,
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
            backoff=backoff or RetryBackoff(initial=0.5, max_delay=10.0),
            handler_threads=handler_threads,
            blocked_loop_warning=blocked_loop_warning,
            prefetch=prefetch,
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
        self._executor = Executor(
            settings.worker_id, settings.handler_threads or settings.concurrency
        )
        self._reports = Reports(
            self._http,
            max_batch=settings.ack_batch_size,
            linger=settings.ack_linger,
            expect_more=lambda: self._executor.running > 0,
            backoff=settings.backoff,
            carry=self._carry,
        )
        self._heartbeats = Heartbeats(
            self._http,
            fraction=settings.heartbeat_fraction,
            request_timeout=settings.request_timeout,
            cancel_grace=settings.cancel_grace,
        )
        # Slots stay taken until a job's outcome is sent, not just until its handler returns:
        # otherwise claims outrun acks under a backlog, unsent outcomes pile up and their
        # leases can expire under finished jobs.
        self._busy = 0
        self._capacity = settings.concurrency + settings.prefetch  # jobs held at most
        # With prefetch, `concurrency` of the jobs held run; the others wait for a slot here.
        self._run_slots = asyncio.Semaphore(settings.concurrency) if settings.prefetch else None
        self._running: dict[Job, RunningJob] = {}  # the jobs held, claimed and not over
        self._link = WorkerLink(self._http, self._suspend, self._spawn_children)
        self._slot_freed = asyncio.Event()
        self._waiting_for_slot = False
        self._carried: _Carried | None = None  # outcomes for the next claim to carry
        self._stop_requested = asyncio.Event()
        self._stopped = asyncio.Event()
        self._claim_task: asyncio.Task[None] | None = None
        # The loop serve() runs on, kept: asking for the running loop per job is a getpid()
        # system call each on Python 3.11 (its check for a fork).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._watchdog = (
            None
            if settings.blocked_loop_warning is None
            else LoopWatchdog(settings.blocked_loop_warning, self._describe_task)
        )

    def reconfigured(
        self,
        *,
        url: str | None = None,
        token: str | None = None,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        prefetch: int | None = None,
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
        if prefetch is not None:
            changes["prefetch"] = prefetch
        worker = Worker.__new__(Worker)
        worker._setup(dataclasses.replace(self.settings, **changes), self.handlers)
        return worker

    def handler(self, type: str) -> Callable[[H], H]:
        """Decorator registering a handler for jobs of `type`: an `async def` runs on the
        event loop and must never block it; a plain `def` runs in a handler thread."""
        return self.handlers.job(type)

    def run(self) -> None:
        """Serve until SIGTERM or SIGINT, then shut down gracefully (a second signal skips the
        rest of the grace period). Blocks; runs its own event loop (see `evora.loops`).
        Without a logging configuration of the program's, it logs readable lines at INFO.
        It takes the process as its own, as a service does: what was built before it
        started is frozen out of the garbage collector's scans, and the youngest generation
        is collected every 10,000 allocations instead of 700 (`evora.collector`); `serve()`
        leaves the collector of the program it runs in as it is."""
        configure_default_logging(secrets=[self.settings.token or ""])
        loops.run(self._serve_until_signalled())

    async def _serve_until_signalled(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        # The process is the worker's, as a service's is its own: what was built to start
        # (modules, handlers, the worker) leaves the collector's scans, and a claim's jobs
        # no longer set off a dozen collections each (evora.collector).
        collector.settle()
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
        for running in self._running.values():
            running.interrupt(Interrupt.SHUTDOWN)

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
        self._loop = asyncio.get_running_loop()
        self._reports.start()
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
        try:
            await self._claim_until_stopped(types)
        finally:
            # A batch handed over while the loop waited for slots, in the same moment as the
            # loop was cancelled (stop): no claim will carry it, the batcher sends it itself.
            carried, self._carried = self._carried, None
            if carried is not None and not carried.answer.done():
                carried.answer.set_exception(
                    EvoraConnectionError("no claim carried them", request_sent=False)
                )

    async def _claim_until_stopped(self, types: list[str]) -> None:
        failures = 0
        while True:
            while self._busy >= self._capacity:
                self._slot_freed.clear()
                self._waiting_for_slot = True
                try:
                    await self._slot_freed.wait()
                finally:
                    self._waiting_for_slot = False
            carried, self._carried = self._carried, None
            try:
                jobs, results = await self._claim(
                    types,
                    min(self._capacity - self._busy, self.settings.concurrency, MAX_CLAIM_JOBS),
                    None if carried is None else carried.acks,
                )
            except EvoraClientError as exc:
                if carried is not None:
                    # The batcher retries them (or sends them one by one if refused).
                    carried.answer.set_exception(exc)
                    if isinstance(exc, EvoraHTTPError) and exc.status in (413, 422):
                        continue  # perhaps refused for an outcome: claim again without
                if isinstance(exc, EvoraHTTPError) and exc.status < 500 and exc.status != 429:
                    log.error("the dispatcher refuses to hand out jobs: %s", exc)
                    raise
                failures += 1
                delay = self.settings.backoff.delay(failures)
                log.warning("claim failed (%s); retrying in %.1fs at most", exc, delay)
                await self._back_off(delay, unready=_means_unready(exc))
                continue
            else:
                if carried is not None:
                    carried.answer.set_result(results or [])
            finally:
                # Cancelled (shutdown) or broken: the batcher must not wait for it forever.
                if carried is not None and not carried.answer.done():
                    carried.answer.set_exception(
                        EvoraConnectionError("the claim carrying them ended", request_sent=True)
                    )
            if failures:
                log.info("claiming again after %d failed attempts", failures)
                failures = 0
            self._heartbeats.schedule([self._start(data) for data in jobs])
            if jobs:
                # Let the handlers just started begin before the next claim is built and
                # sent: they are what the jobs' submitters are waiting for, the next claim
                # (which the dispatcher will mostly hold as a long-poll) can wait one turn.
                await asyncio.sleep(0)
            elif self.settings.wait_seconds == 0:
                # Without a long-poll an empty queue would be asked again at once, forever.
                await asyncio.sleep(IDLE_PAUSE_SECONDS)

    async def _back_off(self, delay: float, *, unready: bool) -> None:
        """Wait `delay` seconds after a failed claim, or less: once the dispatcher has been
        seen unavailable (the failed claim itself, if it could not connect or was answered
        503, or a probe), it is asked every ~`READY_PROBE_SECONDS` whether it is ready
        again (`GET /readyz`, which the dispatcher answers from a short cache), and the
        worker claims as soon as it is. The backoff still spaces claims out while the
        dispatcher answers and is ready but refuses them (a 500, a 429): only the way back
        from an outage is shortened, to within a probe of the dispatcher being ready."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + delay
        while (left := deadline - loop.time()) > 0:
            await asyncio.sleep(min(left, READY_PROBE_SECONDS * (0.75 + random.random() / 2)))
            if loop.time() >= deadline:
                return
            ready = await self._dispatcher_ready()
            if ready and unready:
                log.info("the dispatcher is ready again; claiming")
                return
            unready = unready or not ready

    async def _dispatcher_ready(self) -> bool:
        try:
            await self._http.request(
                "GET", "/readyz", idempotent=True, retries=0, time_limit=READY_PROBE_SECONDS
            )
        except EvoraClientError:
            return False
        return True

    def _carry(self, acks: Sequence[Ack]) -> asyncio.Future[list[dict[str, Any]]] | None:
        """Give a batch of outcomes to the next claim if that claim is due now: the claim
        loop waits for a slot and the batch's jobs have just freed some (their slots are
        freed as a batch goes out, before it is sent). Otherwise None: the batch must not
        wait for a claim that may long-poll or never come."""
        if (
            not self._waiting_for_slot
            or self._busy >= self._capacity
            or self._carried is not None
            or self._stop_requested.is_set()
        ):
            return None
        answer: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._carried = _Carried([ack.item() for ack in acks], answer)
        self._slot_freed.set()
        return answer

    async def _claim(
        self, types: list[str], max_jobs: int, acks: list[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        body: dict[str, Any] = {
            "worker_id": self.settings.worker_id,
            "queues": list(self.settings.queues),
            "max_jobs": max_jobs,
            "wait_seconds": self.settings.wait_seconds,
            "types": types,
        }
        if acks is not None:
            # Outcomes are answered when the claim returns: they must not wait a long-poll
            # out (their jobs' tasks and heartbeats wait for the answer).
            body["acks"] = acks
            body["wait_seconds"] = 0
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
        results: list[dict[str, Any]] | None = resp.data.get("results")
        return jobs, results

    def _start(self, data: Mapping[str, Any]) -> RunningJob:
        job = Job.from_claim(data)
        job._worker = self._link
        running = RunningJob(job)
        self._busy += 1
        assert self._loop is not None  # set by serve(), which claimed the job
        running.task = self._loop.create_task(
            self._process(running, self.handlers.get(job.type)), name=f"evora-job-{job.id}"
        )
        self._running[job] = running
        return running

    async def _process(self, running: RunningJob, handler: Handler | None) -> None:
        job = running.job
        # This task runs in a copy of the context, so nothing needs unbinding. Its records,
        # the handler's and the heartbeats' say which job.
        bind(job_id=job.id, queue=job.queue, job_type=job.type)
        try:
            with job_trace(job) as trace:
                if self._run_slots is None:
                    outcome = await self._executor.execute(running, handler)
                else:
                    outcome = await self._executor.execute_in_slot(
                        running, handler, self._run_slots
                    )
                trace.ended(
                    outcome.outcome
                    if isinstance(outcome, Ack)
                    else "snooze"
                    if isinstance(outcome, Snoozed)
                    else outcome
                )
                if outcome == "release":
                    await self._reports.release(job)
                elif isinstance(outcome, Snoozed):
                    await self._reports.snooze(job, outcome.seconds)
                elif isinstance(outcome, Ack):
                    with trace.ack(outcome.outcome):
                        await self._reports.report(outcome, lambda: self._release_slot(running))
        except EvoraClientError as exc:
            log.error(
                "job %s: could not tell the dispatcher how it ended (%s); it will run again "
                "when its lease expires",
                job.id,
                exc,
            )
        finally:
            running.stop_timers()
            del self._running[job]
            if running.thread is not None and not running.thread.done():
                self._free_slot_when_done(running)
            else:
                self._release_slot(running)

    async def _suspend(self, job: Job, timeout_seconds: float, on_timeout: str) -> str:
        """`Job.suspend`: the heartbeats stop first (once suspended, the job's lease is gone
        and a heartbeat would interrupt the handler as if it had been lost)."""
        self._stop_timers(job)
        callback_id = await self._reports.suspend(job, timeout_seconds, on_timeout)
        if callback_id is None:
            raise JobCancelled(f"cancellation of job {job.id} was requested")
        return callback_id

    async def _spawn_children(
        self, job: Job, jobs: list[Submission], on_dependency_failure: str | None
    ) -> list[str]:
        """`Job.spawn_children`: the heartbeats stop first, as for a suspend."""
        self._stop_timers(job)
        children = await self._reports.spawn_children(job, jobs, on_dependency_failure)
        if children is None:
            raise JobCancelled(f"cancellation of job {job.id} was requested")
        return children

    def _stop_timers(self, job: Job) -> None:
        # Not held any more (its task has ended) when a handler's own task calls this late:
        # its timers are stopped already.
        running = self._running.get(job)
        if running is not None:
            running.stop_timers()

    def _release_slot(self, running: RunningJob) -> None:
        """Free the job's slot, once; never while its handler's thread still runs."""
        if running.holds_slot and (running.thread is None or running.thread.done()):
            running.holds_slot = False
            self._free_slot()

    def _free_slot(self) -> None:
        self._busy -= 1
        self._slot_freed.set()

    def _free_slot_when_done(self, running: RunningJob) -> None:
        """The job is over for the worker but its sync handler still runs: its thread keeps
        the slot, so abandoned threads never add up to more than `concurrency`."""
        assert running.thread is not None
        log.warning(
            "job %s: its handler %s is still running in a thread, which cannot be stopped; "
            "whatever it returns will be discarded",
            running.job.id,
            _name_of(self.handlers.get(running.job.type)),
        )
        when_thread_done(running.thread, lambda: self._release_slot(running))

    async def _shutdown(self) -> None:
        self._stop_requested.set()
        # Jobs claimed ahead that have not started go back at once, not after the grace.
        for running in self._running.values():
            if running.waiting:
                running.interrupt(Interrupt.SHUTDOWN)
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
                for running in self._running.values():
                    running.give_up()
                # A handler that ignores cancellation keeps its task alive: waiting for it
                # would keep serve() from returning.
                tasks = {
                    running.task for running in self._running.values() if not running.in_handler
                }
                if tasks:
                    await asyncio.wait(tasks)
            # Every outcome a job task waited for has been sent; what is left belongs to
            # tasks given up on just now, so this is a last, short chance.
            await self._reports.close(within=1.0)
            await self._http.close()
        finally:
            self._executor.close()
            if self._watchdog is not None:
                self._watchdog.stop()
            self._stopped.set()
        log.info("worker %s stopped", self.settings.worker_id)

    async def _wait_running(self, seconds: float) -> None:
        tasks = {running.task for running in self._running.values()}
        if tasks:
            await asyncio.wait(tasks, timeout=seconds)

    def _describe_task(self, task: asyncio.Task[Any] | None) -> str:
        """For the watchdog, in its thread: which job's handler `task` runs."""
        if task is None:
            return "a callback outside any task"
        # A copy first: the set may change on the loop meanwhile (copying takes no turns).
        for running in tuple(self._running.values()):
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


def _means_unready(exc: EvoraClientError) -> bool:
    """Whether a failed claim says the dispatcher is unavailable (down, restarting, or
    without its database), rather than up and refusing this request."""
    if isinstance(exc, EvoraHTTPError):
        return exc.status == 503
    return isinstance(exc, EvoraConnectionError)
