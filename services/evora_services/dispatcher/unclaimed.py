"""Jobs that no worker claims: a signal instead of a silent wait.

A job whose type no running worker handles (a typo in the type, a worker not deployed, one
started on other queues) stays PENDING for ever. Every `CHECK_SECONDS` this looks for jobs
that have been due for longer than EVORA_UNCLAIMED_WARNING_SECONDS without being claimed,
leaving out those that wait for a reason (a paused queue, a FIFO group whose previous job
still runs, a concurrency or rate limit with no room left: those are the flow-control
metrics' throttled jobs), and per queue and type
- sets the gauge `evora_dispatcher_unclaimed_jobs{queue,type}` (removed once they move),
- logs a WARNING when a queue and type start to starve, and INFO once they are claimed again.

It reads `jobs` through the partial index of pending jobs by run_at, on its own schedule,
and never touches the claim path. Every dispatcher replica checks and reports the same.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime

import asyncpg
from prometheus_client import CollectorRegistry, Gauge

from evora.storage import queries

log = logging.getLogger(__name__)

CHECK_SECONDS = 30.0
# Queue and type pairs reported at once: bounds the gauge's series and the query's answer.
MAX_REPORTED = 100


@dataclass(frozen=True)
class Unclaimed:
    queue: str
    type: str
    pending: int
    oldest: datetime


class UnclaimedWatch:
    def __init__(
        self, pool: asyncpg.Pool, registry: CollectorRegistry, after_seconds: float
    ) -> None:
        self._pool = pool
        self.after_seconds = after_seconds
        self._gauge = Gauge(
            "evora_dispatcher_unclaimed_jobs",
            "PENDING jobs due for longer than EVORA_UNCLAIMED_WARNING_SECONDS that no worker "
            "claimed (not paused, not waiting behind their FIFO group or held back by a "
            "limit), by queue and type.",
            ["queue", "type"],
            registry=registry,
        )
        self._starving: set[tuple[str, str]] = set()

    async def check(self) -> list[Unclaimed]:
        rows = await self._pool.fetch(queries.UNCLAIMED_JOBS, self.after_seconds, MAX_REPORTED)
        found = [Unclaimed(r["queue"], r["type"], r["pending"], r["oldest"]) for r in rows]
        now = {(u.queue, u.type): u for u in found}
        for queue, type_ in sorted(self._starving - now.keys()):
            self._gauge.remove(queue, type_)
            log.info("jobs of type %s in queue %s are being claimed again", type_, queue)
        for key, unclaimed in now.items():
            self._gauge.labels(*key).set(unclaimed.pending)
            if key not in self._starving:
                log.warning(
                    "%d PENDING job(s) of type %s in queue %s have been due for over %.0f s "
                    "(the oldest since %s) and no worker claimed them: is a worker with a "
                    "handler for %s on queue %s running, with free slots?",
                    unclaimed.pending,
                    unclaimed.type,
                    unclaimed.queue,
                    self.after_seconds,
                    unclaimed.oldest.isoformat(),
                    unclaimed.type,
                    unclaimed.queue,
                    extra={"queue": unclaimed.queue, "job_type": unclaimed.type},
                )
        self._starving = set(now)
        return found

    async def run_forever(self, interval: float = CHECK_SECONDS) -> None:
        while True:
            try:
                await self.check()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                # The database is away: the claim path reports that; try again later.
                log.debug("unclaimed-jobs check failed: %s", exc)
            await asyncio.sleep(interval)
