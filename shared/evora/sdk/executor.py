"""Running a job's handler: an `async def` on the event loop, a plain `def` in one of the
worker's handler threads, and turning how it ended into the outcome to report."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from evora.sdk.acks import Ack
from evora.sdk.handlers import Handler, runs_on_loop
from evora.sdk.running import Abandon, Release, RunningJob
from evora.sdk.threads import HandlerThreads

log = logging.getLogger("evora.worker")


class Executor:
    def __init__(self, worker_id: str, threads: int) -> None:
        self._worker_id = worker_id
        self._threads = HandlerThreads(threads, name="evora-handler")
        # Handlers running right now (the ack batcher lingers for outcomes while any run).
        self.running = 0

    async def execute(
        self, running: RunningJob, handler: Handler | None
    ) -> Ack | Release | Abandon:
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
        task = running.task
        for _ in range(running.interrupts):
            task.uncancel()
        if task.cancelling():
            # Cancelled by someone else (shutdown giving up, or asyncio.run ending): nothing
            # is reported, whatever the handler did with the cancellation.
            raise asyncio.CancelledError
        return running.outcome(result, failure, cancelled)

    def close(self) -> None:
        self._threads.close()
