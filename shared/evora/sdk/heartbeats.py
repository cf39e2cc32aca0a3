"""Heartbeats: every `heartbeat_fraction` of a job's lease, extend the lease, carry the
progress its handler reported, and learn about cancel requests and attempts past their time
limit.

Most jobs end long before their first heartbeat, so nothing runs per job until then: the
jobs of one claim with the same lease wait for it together (`FirstBeat`, one timer for all
of them, cancelled when the last one ends), and a job's heartbeat task starts only when
that timer fires while it still runs. A drain of a thousand jobs a second then arms a few
timers a second, not a thousand (each armed and cancelled again on the event loop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from evora.sdk._http import Transport, should_retry
from evora.sdk.errors import EvoraClientError, JobNotFoundError, LeaseLostError
from evora.sdk.running import Interrupt, RunningJob

log = logging.getLogger("evora.worker")


class FirstBeat:
    """Jobs of one claim, with one lease length, whose first heartbeat is not due yet."""

    __slots__ = ("members", "timer")

    def __init__(self) -> None:
        self.members: set[RunningJob] = set()
        self.timer: asyncio.TimerHandle | None = None

    def leave(self, running: RunningJob) -> None:
        """`running` ended before its first heartbeat; the last one out stops the timer."""
        self.members.discard(running)
        if not self.members and self.timer is not None:
            self.timer.cancel()


class Heartbeats:
    def __init__(
        self, http: Transport, *, fraction: float, request_timeout: float, cancel_grace: float
    ) -> None:
        self._http = http
        self._fraction = fraction
        self._request_timeout = request_timeout
        self._cancel_grace = cancel_grace

    def schedule(self, claimed: Iterable[RunningJob]) -> None:
        """Arm the first heartbeat of the jobs of one claim, one timer per lease length;
        `running.stop_timers()` ends a job's heartbeats."""
        by_interval: dict[float, FirstBeat] = {}
        for running in claimed:
            interval = running.job.lease_seconds * self._fraction
            group = by_interval.get(interval)
            if group is None:
                group = by_interval[interval] = FirstBeat()
            group.members.add(running)
            running.first_beat = group
        loop = asyncio.get_running_loop()
        for interval, group in by_interval.items():
            group.timer = loop.call_later(interval, self._start, group, interval)

    def _start(self, group: FirstBeat, interval: float) -> None:
        loop = asyncio.get_running_loop()
        members, group.members = group.members, set()
        for running in members:
            running.first_beat = None
            running.heartbeat = loop.create_task(
                self._beat(running, interval), name=f"evora-hb-{running.job.id}"
            )

    async def _beat(self, running: RunningJob, interval: float) -> None:
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
                    time_limit=min(interval, self._request_timeout),
                )
            except (LeaseLostError, JobNotFoundError) as exc:
                log.warning("job %s: %s; abandoning it", job.id, exc)
                running.interrupt(Interrupt.LEASE_LOST)
                return
            except EvoraClientError as exc:
                if should_retry(exc, idempotent=True):
                    if progress is not None:
                        job._restore_progress(progress)
                    # Sooner than usual: the lease keeps running out meanwhile.
                    delay = interval / 4
                log.warning("job %s: heartbeat failed: %s", job.id, exc)
            else:
                if resp.data.get("timeout_requested") and not job.timeout_requested:
                    job._timeout_requested = True
                    self._cancel_requested(running, Interrupt.TIMEOUT)
                elif resp.data.get("cancel_requested") and not job.cancel_requested:
                    self._cancel_requested(running, Interrupt.CANCEL)
            await asyncio.sleep(max(0.0, sent_at + delay - loop.time()))

    def _cancel_requested(self, running: RunningJob, why: Interrupt) -> None:
        """Tell the handler (`job.cancel_event`) that it should stop, for `why` (a cancel
        request, or the attempt past its max_duration_seconds); cancel it if it has not ended
        after `cancel_grace` seconds."""
        running.job.cancel_event.set()
        if running.waiting:  # claimed ahead and not started: it never will be
            running.interrupt(why)
        elif running.in_handler:
            log.info(
                "job %s: %s; the handler has %.1fs to stop",
                running.job.id,
                why,
                self._cancel_grace,
            )
            if running.cancel_timer is not None:  # a timeout after a cancel: restarts it
                running.cancel_timer.cancel()
            running.cancel_timer = asyncio.get_running_loop().call_later(
                self._cancel_grace, running.interrupt, why
            )
