"""Running a job's handler: an `async def` on the event loop, a plain `def` in one of the
worker's handler threads, and turning how it ended into the outcome to report."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from evora.sdk.acks import Ack
from evora.sdk.handlers import Handler, runs_on_loop
from evora.sdk.running import Abandon, Interrupt, Release, RunningJob, Snoozed, Suspended
from evora.sdk.threads import HandlerThreads, when_thread_done

log = logging.getLogger("evora.worker")


class Executor:
    def __init__(self, worker_id: str, threads: int) -> None:
        self._worker_id = worker_id
        self._threads = HandlerThreads(threads, name="evora-handler")
        # Handlers running right now (the ack batcher lingers for outcomes while any run).
        self.running = 0

    async def execute(
        self, running: RunningJob, handler: Handler | None
    ) -> Ack | Release | Abandon | Snoozed | Suspended:
        job = running.job
        if handler is None:
            # Retryable: another worker of the fleet may know the type.
            log.error("job %s: no handler for type %r", job.id, job.type)
            message = f"worker {self._worker_id} has no handler for {job.type!r}"
            error = {"message": message, "type": "UnknownJobType", "retryable": True}
            return Ack(job.id, job.lease_token, "fail", error=error)
        result: Any = None
        failure: BaseException | None = None
        cancelled = False
        self.running += 1
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
            self.running -= 1
        _take_back_interrupts(running)
        return running.outcome(result, failure, cancelled)

    async def execute_in_slot(
        self, running: RunningJob, handler: Handler | None, slots: asyncio.Semaphore
    ) -> Ack | Release | Abandon | Snoozed | Suspended:
        """`execute` in one of `slots`, waiting for one first: the job was claimed ahead of
        time (the worker's `prefetch`). One interrupted while it waits never runs: it is
        abandoned if its lease was lost, failed if it ran past its max_duration_seconds
        (waiting counts: the attempt's time started with its claim), else released
        (shutdown, a cancel request)."""
        running.waiting = True
        try:
            await slots.acquire()
        except asyncio.CancelledError:
            _take_back_interrupts(running)
            if running.job.timeout_requested:
                return running.outcome(None, None, cancelled=True)
            return "abandon" if running.interrupted is Interrupt.LEASE_LOST else "release"
        finally:
            running.waiting = False
        try:
            return await self.execute(running, handler)
        finally:
            thread = running.thread
            if thread is None or thread.done():
                slots.release()
            else:
                # A handler thread still runs (given up on): it keeps the slot until it
                # returns, so no more handlers than slots ever run at once.
                when_thread_done(thread, slots.release)

    def close(self) -> None:
        self._threads.close()


def _take_back_interrupts(running: RunningJob) -> None:
    """Undo the cancellations that interrupts made of the job's task; raise if the task was
    also cancelled by someone else (shutdown giving up, or asyncio.run ending): then nothing
    is reported, whatever the handler did with the cancellation."""
    task = running.task
    for _ in range(running.interrupts):
        task.uncancel()
    if task.cancelling():
        raise asyncio.CancelledError
