"""Coalescing of job outcomes into `POST /v1/acks` requests (docs/http-api.md#post-v1acks).

One flusher sends at most one batch at a time. While a batch is in flight, new outcomes
queue up and go together in the next one, so the batch size follows the load without any
timer. On top of that, when other handlers are still running (so more outcomes are likely
within milliseconds), the flusher lingers up to `linger` seconds for the batch to fill. When
nothing else is running it sends at once: a lone job's outcome is never delayed.

Each outcome may name a callback run when it is taken into a batch being sent: the worker
frees the job's slot then, so its next claim overlaps this batch's round trip, while
outcomes still queued keep their slots (so at most one batch is ever unsent beyond them).

Sending a batch again after a lost answer is safe: repeating a `complete` with the same
lease token returns 200 with the same job, and repeating a `fail` finds the lease gone and
changes nothing (409). Transient failures (see `should_retry`) are therefore retried with
backoff until they succeed or `close()` gives up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import orjson

from evora.protocol.retries import RetryBackoff
from evora.sdk._http import should_retry
from evora.sdk.errors import EvoraClientError, EvoraConnectionError

log = logging.getLogger("evora.worker")


class Ack(NamedTuple):
    """The outcome of one job: `result` (already encoded) for complete, `error` for fail.
    A tuple: one is built per job, at a third of the cost of a frozen dataclass."""

    job_id: str
    lease_token: str
    outcome: Literal["complete", "fail"]
    result: orjson.Fragment | None = None
    error: Mapping[str, Any] | None = None
    # an upstream's rate limit (`RetryAfter`): {"limit_key": ..., "seconds": ...}
    retry_after: Mapping[str, Any] | None = None

    def item(self) -> dict[str, Any]:
        """One entry of `POST /v1/acks` (one per job of a batch: one dict, built at once)."""
        if self.outcome == "complete":
            return {
                "id": self.job_id,
                "outcome": "complete",
                "lease_token": self.lease_token,
                "result": self.result,
            }
        item = {
            "id": self.job_id,
            "outcome": "fail",
            "lease_token": self.lease_token,
            "error": self.error,
        }
        if self.retry_after is not None:
            item["retry_after"] = self.retry_after
        return item

    def endpoint_body(self) -> dict[str, Any]:
        """The body of `POST /v1/jobs/{id}/complete` or `/fail`: the item without what the
        path says."""
        body = self.item()
        del body["id"], body["outcome"]
        return body


_Entry = tuple[Ack, asyncio.Future[int], Callable[[], None] | None]

SendAcks = Callable[[Sequence[Ack]], Awaitable[Mapping[str, int]]]
"""Delivers a batch; returns the HTTP status for each job id (200, 404 or 409)."""


class AckBatcher:
    def __init__(
        self,
        send: SendAcks,
        *,
        max_batch: int,
        linger: float,
        expect_more: Callable[[], bool],
        backoff: RetryBackoff,
    ) -> None:
        if not 1 <= max_batch <= 1000:
            raise ValueError("max_batch must be 1..1000 (the limit of POST /v1/acks)")
        self._send = send
        self._max_batch = max_batch
        self._linger = linger
        self._expect_more = expect_more
        self._backoff = backoff
        self._pending: list[_Entry] = []
        self._in_flight: list[_Entry] = []
        self._wakeup = asyncio.Event()
        self._flush_now = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        # The loop `start` ran on: asking for the running loop per outcome is a getpid()
        # system call each on Python 3.11 (its check for a fork).
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="evora-acks")

    def submit(self, ack: Ack, on_sent: Callable[[], None] | None = None) -> asyncio.Future[int]:
        """Queue an outcome; the future resolves to its status once the dispatcher answered.
        `on_sent` runs when the outcome goes into a batch being sent (once, even if that batch
        is retried)."""
        assert self._loop is not None, "submit() before start()"
        future: asyncio.Future[int] = self._loop.create_future()
        self._pending.append((ack, future, on_sent))
        self._wakeup.set()
        if len(self._pending) >= self._max_batch or not self._expect_more():
            self._flush_now.set()
        return future

    async def close(self, within: float) -> None:
        """Send everything queued, trying for at most `within` seconds, then stop."""
        self._closing = True
        self._wakeup.set()
        self._flush_now.set()
        if self._task is not None:
            done, _ = await asyncio.wait({self._task}, timeout=within)
            if not done:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        unsent = self._in_flight + self._pending
        self._in_flight, self._pending = [], []
        if unsent:
            log.error(
                "%d job outcomes could not be reported; their leases will expire and the "
                "jobs will run again",
                len(unsent),
            )
            lost = EvoraConnectionError(
                "the worker stopped before this was sent", request_sent=True
            )
            _settle(unsent, lost)

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            if not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                continue
            if not self._closing and len(self._pending) < self._max_batch and self._expect_more():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._flush_now.wait(), self._linger)
            # No await between here and taking the batch: every signal raised after these
            # clears concerns outcomes that are not in it.
            self._flush_now.clear()
            self._wakeup.clear()
            self._in_flight = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            for _, _, on_sent in self._in_flight:
                if on_sent is not None:
                    on_sent()
            await self._deliver(self._in_flight)
            self._in_flight = []
            if self._pending:
                self._wakeup.set()

    async def _deliver(self, batch: list[_Entry]) -> None:
        failures = 0
        while True:
            try:
                statuses = await self._send([ack for ack, _, _ in batch])
            except EvoraClientError as exc:
                if not should_retry(exc, idempotent=True):
                    _settle(batch, exc)
                    return
                failures += 1
                delay = self._backoff.delay(failures)
                log.warning(
                    "could not report %d job outcomes (%s); retrying in %.2fs",
                    len(batch),
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            for ack, future, _ in batch:
                # A future is already done when the job task awaiting it was cancelled.
                if not future.done():
                    future.set_result(statuses[ack.job_id])
            return


def _settle(entries: list[_Entry], error: BaseException) -> None:
    for _, future, _ in entries:
        if not future.done():
            future.set_exception(error)
