"""Handlers by job type, and the `Job` a handler receives."""

from __future__ import annotations

import asyncio
import inspect
import re
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import orjson

from evora.protocol.bounds import TYPE_PATTERN
from evora.sdk.errors import JobCancelled

if TYPE_CHECKING:
    from evora.sdk._http import Transport
    from evora.sdk.client import Submission

_TYPE_RE = re.compile(TYPE_PATTERN)

# What a sync handler's thread and the event loop may change of one job at once: its
# progress (taking it is a read and a clear, with no report falling in between) and its
# cancel event while it is created. One lock for all jobs, not one per job: the steps it
# guards are a few bytecodes long, and a drain builds a thousand jobs a second.
_SHARED_STATE = threading.Lock()

_NO_CHECKPOINTS: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class WorkerLink:
    """How the jobs a worker runs reach it: one per worker, shared by all its jobs. A job
    holds nothing of its own for features it may never use, and nothing that leads back to
    the worker's record of it: a job and that record referring to each other would be a
    reference cycle, which only the cyclic garbage collector frees, and its runs over every
    job of a drain cost the worker more CPU than the rest of the job's own work
    (docs/benchmarks/2026-11-29-worker-cpu-per-job.md)."""

    transport: Transport
    # Suspends the job on a callback (timeout seconds, on_timeout): its callback id.
    suspend: Callable[[Job, float, str], Awaitable[str]]
    # Submits children and makes the job wait for them (children, on_dependency_failure):
    # their ids.
    spawn_children: Callable[[Job, list[Submission], str | None], Awaitable[list[str]]]


@dataclass(eq=False)
class Job:
    """One claimed job, as its handler sees it.

    `data` is everything the dispatcher sent (priority, group_key, run_at, ...). The worker
    sets `cancel_event` when a heartbeat reports that cancellation was requested; a handler
    can check `cancel_requested`, call `raise_if_cancel_requested()` between steps, or (async
    handlers only) race its work against `cancel_event.wait()`. `cancel_requested`,
    `raise_if_cancel_requested()` and `progress()` are safe to call from the thread a plain
    `def` handler runs in."""

    id: str
    queue: str
    type: str
    payload: Any
    attempt: int
    max_attempts: int
    lease_seconds: int
    lease_token: str = field(repr=False)
    data: Mapping[str, Any] = field(repr=False)
    # Created when first asked for (most jobs never are): see `cancel_event`.
    _cancel_event: asyncio.Event | None = field(default=None, repr=False)
    _timeout_requested: bool = field(default=False, repr=False)
    _progress: orjson.Fragment | None = field(default=None, repr=False)
    # The worker running the job (None outside one), for `checkpoint`, `suspend` and
    # `spawn_children`.
    _worker: WorkerLink | None = field(default=None, repr=False)
    # The checkpoints as `checkpoint()` last answered them; until then the claim's.
    _checkpoints: Mapping[str, Any] | None = field(default=None, repr=False)
    # The callback id once the handler suspended the job.
    callback_id: str | None = field(default=None, repr=False)
    # The children's ids once the handler made the job wait for them (`spawn_children`).
    children: list[str] | None = field(default=None, repr=False)

    @classmethod
    def from_claim(cls, data: Mapping[str, Any]) -> Job:
        return cls(
            id=str(data["id"]),
            queue=data["queue"],
            type=data["type"],
            payload=data.get("payload"),
            attempt=int(data["attempt"]),
            max_attempts=int(data["max_attempts"]),
            lease_seconds=int(data["lease_seconds"]),
            lease_token=str(data["lease_token"]),
            data=data,
        )

    @property
    def snoozes(self) -> int:
        """The times the job was snoozed before this run (`Snooze`; docs/jobs-that-wait.md):
        its attempt number does not count them. 0 from a dispatcher that predates snooze."""
        return int(self.data.get("snoozes", 0))

    @property
    def callback(self) -> Mapping[str, Any] | None:
        """The callback this job waited on before this run (docs/callbacks.md): `payload`
        (what its resolution carried), `timed_out`, `resolved_at`, `id`, ...; None if it
        never suspended. A handler that suspends checks it first to tell a resumed run from
        the first one."""
        callback: Mapping[str, Any] | None = self.data.get("callback")
        return callback

    async def suspend(
        self, timeout_seconds: float, on_timeout: Literal["fail", "dlq", "resume"] = "fail"
    ) -> str:
        """Suspend the job on a callback (docs/callbacks.md) and answer the callback id, the
        credential an external system resolves it with (`POST /v1/callbacks/{callback_id}`,
        or `Client.resolve_callback`). The attempt leaves the worker at once: no heartbeats,
        no lease, no limit slot; hand the id on and return (what the handler returns or
        raises afterwards is dropped). The job runs again, with `callback` set, when the
        callback is resolved or, after `timeout_seconds` (at most 30 days), as `on_timeout`
        says: `fail` the attempt, `dlq`, or `resume` with `callback["timed_out"]`. Raises
        `JobCancelled` if a cancel was requested (the job is cancelled instead) and
        `LeaseLostError` if the lease is no longer the job's. Async handlers only."""
        if self._worker is None:
            raise RuntimeError("only a job a worker runs can be suspended")
        if self.callback_id is not None:
            raise RuntimeError(f"job {self.id} is already suspended")
        self.callback_id = await self._worker.suspend(self, timeout_seconds, on_timeout)
        return self.callback_id

    async def spawn_children(
        self,
        jobs: Iterable[Submission],
        *,
        on_dependency_failure: Literal["cancel", "run"] | None = None,
    ) -> list[str]:
        """Submit children (1..10,000 items as `Client.submit_batch` takes them) and make the
        job wait for them (docs/jobs-that-wait.md), all in one transaction; answers their ids
        in order. The attempt leaves the worker at once, uncounted: no heartbeats, no lease, no
        limit slot while it waits; return after this (what the handler returns or raises
        afterwards is dropped). The job runs again once every child ended, as a new run of
        the same attempt number, with their results in `dependency_results`; a cancelled
        child cancels it under `on_dependency_failure="cancel"` (None keeps the job's own).
        Raises `JobCancelled` if a cancel was requested (no child is submitted),
        `LeaseLostError` if the lease is no longer the job's, `RequestValidationError` for an
        invalid child (none is submitted). Async handlers only."""
        if self._worker is None:
            raise RuntimeError("only a job a worker runs can spawn children")
        if self.left_worker:
            raise RuntimeError(f"job {self.id} already left the worker")
        self.children = await self._worker.spawn_children(self, list(jobs), on_dependency_failure)
        return self.children

    @property
    def left_worker(self) -> bool:
        """Whether the attempt left the worker while its handler ran: suspended on a callback
        or waiting for children. Then the handler's outcome is not reported."""
        return self.callback_id is not None or self.children is not None

    @property
    def dependency_results(self) -> Mapping[str, Any]:
        """{job id: result} of the COMPLETED jobs this one depends on (empty without
        dependencies)."""
        results: Mapping[str, Any] = self.data.get("dependency_results") or {}
        return results

    @property
    def checkpoints(self) -> Mapping[str, Any]:
        """The steps recorded with `checkpoint()`, name -> data: by earlier attempts (handed
        over with the claim) and by this one. A handler resumes after the last step done
        instead of repeating it (docs/jobs-that-wait.md). Empty when none."""
        if self._checkpoints is None:
            # Read from the claim when asked, not copied for every job: most never are.
            claimed: Mapping[str, Any] = self.data.get("checkpoints") or _NO_CHECKPOINTS
            return claimed
        return self._checkpoints

    async def checkpoint(self, name: str, data: Any = None) -> None:
        """Record that step `name` is done, with what it produced (any JSON value), on the
        job, before going on: a later attempt finds it in `checkpoints`. A name recorded again
        replaces its data. `POST /v1/jobs/{id}/checkpoints`, fenced by the lease: raises
        `LeaseLostError` if this attempt no longer holds the job (stop: another may run it),
        `PayloadTooLargeError` past 100 names or 1 MiB in all. Async handlers only (a `def`
        handler's thread cannot await it)."""
        if self._worker is None:
            raise RuntimeError("checkpoint() needs a job a worker claimed")
        resp = await self._worker.transport.request(
            "POST",
            f"/v1/jobs/{self.id}/checkpoints",
            body={"lease_token": self.lease_token, "name": name, "data": data},
            # the same name and data again stores the same: safe to repeat
            idempotent=True,
        )
        self._checkpoints = dict(resp.data["checkpoints"])

    @property
    def cancel_event(self) -> asyncio.Event:
        """Set when cancellation of the job was requested."""
        event = self._cancel_event
        if event is None:
            # A handler thread may ask in the same moment as the loop: one event for both.
            with _SHARED_STATE:
                event = self._cancel_event
                if event is None:
                    event = self._cancel_event = asyncio.Event()
        return event

    @property
    def cancel_requested(self) -> bool:
        event = self._cancel_event
        return event is not None and event.is_set()

    @property
    def max_duration_seconds(self) -> int | None:
        """The hard time limit of this attempt (docs/jobs-that-wait.md), None without one."""
        value = self.data.get("max_duration_seconds")
        return None if value is None else int(value)

    @property
    def timeout_requested(self) -> bool:
        """True once a heartbeat reported that the attempt ran past `max_duration_seconds`.
        The worker then sets `cancel_event` too, so a handler that stops on a cancel stops on
        a timeout; it fails the attempt with error type `timeout` (retried per the job's
        policy) instead of handing the job back."""
        return self._timeout_requested

    def raise_if_cancel_requested(self) -> None:
        if self.cancel_requested:
            raise JobCancelled(f"cancellation of job {self.id} was requested")

    def progress(self, value: Any) -> None:
        """Report progress (any JSON value) with the next heartbeat; a newer report replaces
        one not yet sent. Raises TypeError at once when `value` is not JSON-serialisable."""
        encoded = orjson.Fragment(orjson.dumps(value))
        with _SHARED_STATE:
            self._progress = encoded

    def _take_progress(self) -> orjson.Fragment | None:
        with _SHARED_STATE:
            progress, self._progress = self._progress, None
        return progress

    def _restore_progress(self, progress: orjson.Fragment) -> None:
        with _SHARED_STATE:
            if self._progress is None:
                self._progress = progress


AsyncHandler = Callable[[Job], Coroutine[Any, Any, Any]]
"""An `async def` taking the `Job` and returning its JSON-serialisable result; it runs on
the worker's event loop, so it must never block it."""

SyncHandler = Callable[[Job], Any]
"""A plain `def` taking the `Job` and returning its JSON-serialisable result; the worker runs
it in a thread of its own, so it may block (CPU work, blocking libraries, `time.sleep`)."""

Handler = AsyncHandler | SyncHandler

H = TypeVar("H", bound=Handler)


def runs_on_loop(handler: Handler) -> bool:
    """Whether the worker awaits `handler` on its event loop (an `async def`, also behind
    `functools.partial`) rather than calling it in a thread."""
    return inspect.iscoroutinefunction(handler)


class Handlers:
    """A registry of handlers by job type.

    A module can define one and leave the rest (dispatcher URL, token, queues, concurrency)
    to `evora worker MODULE`; a `Worker` keeps its handlers in one too::

        handlers = evora.Handlers()

        @handlers.job("email.send")
        async def send(job: evora.Job) -> dict[str, str]: ...

        @handlers.job("report.render")
        def render(job: evora.Job) -> dict[str, str]: ...  # blocking work: runs in a thread
    """

    def __init__(self) -> None:
        self._by_type: dict[str, Handler] = {}

    def job(self, type: str) -> Callable[[H], H]:
        """Decorator registering a handler (`async def`, or `def` run in a thread) for jobs
        of `type`."""

        def register(handler: H) -> H:
            self.add(type, handler)
            return handler

        return register

    def add(self, type: str, handler: Handler) -> None:
        if not _TYPE_RE.fullmatch(type):
            raise ValueError(f"invalid job type {type!r}: must match {TYPE_PATTERN}")
        if not callable(handler):
            raise TypeError(f"the handler for {type!r} must be a function")
        if inspect.isgeneratorfunction(handler) or inspect.isasyncgenfunction(handler):
            # Its result would be a generator, never the job's result.
            raise TypeError(f"the handler for {type!r} must return its result, not yield")
        existing = self._by_type.get(type)
        if existing is not None and existing is not handler:
            raise ValueError(f"a handler for {type!r} is already registered")
        self._by_type[type] = handler

    def include(self, other: Handlers) -> None:
        """Register every handler of `other` here too."""
        for type, handler in other._by_type.items():
            self.add(type, handler)

    def get(self, type: str) -> Handler | None:
        return self._by_type.get(type)

    @property
    def types(self) -> list[str]:
        return sorted(self._by_type)
