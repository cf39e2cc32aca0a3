"""Jobs that no worker claims: a signal instead of a silent wait.

A job whose type no running worker handles (a typo in the type, a worker not deployed, one
started on other queues) stays PENDING for ever. Every `CHECK_SECONDS` this looks for jobs
that have been due for longer than EVORA_UNCLAIMED_WARNING_SECONDS without being claimed,
leaving out those that wait for a reason (a paused queue, a FIFO group whose previous job
still runs, a concurrency or rate limit with no room left: those are the flow-control
metrics' throttled jobs), and per queue and type
- sets the gauge `evora_dispatcher_unclaimed_jobs{queue,type}` (removed once they move),
- logs a WARNING when a queue and type start to starve, and INFO once they are claimed again.

It reads `jobs` through the partial index of pending jobs (jobs_claimable), on its own
schedule, and never touches the claim path. Every dispatcher replica checks and reports the
same. Its cost is bounded in the backlog: of each queue it looks at the first
`LOOKED_AT_PER_QUEUE` jobs due for longer than that, in the order claims take them, so with a
larger backlog a count is a lower bound (`at_least`, "at least N" in the warning), and a
type whose jobs all lie behind that many others of its queue is reported once they come
within it.
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
# Jobs looked at per queue (of each of its priorities at most one more): what bounds the
# check's reads in a backlog of any size (tests/integration/test_generic_plans.py).
LOOKED_AT_PER_QUEUE = 1_000


@dataclass(frozen=True)
class Unclaimed:
    queue: str
    type: str
    pending: int
    oldest: datetime
    # the queue has more jobs due for that long than were looked at: `pending` is a lower bound
    at_least: bool = False


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
        rows = await self._pool.fetch(
            queries.UNCLAIMED_JOBS, self.after_seconds, MAX_REPORTED, LOOKED_AT_PER_QUEUE
        )
        found = [
            Unclaimed(r["queue"], r["type"], r["pending"], r["oldest"], r["at_least"]) for r in rows
        ]
        now = {(u.queue, u.type): u for u in found}
        for queue, type_ in sorted(self._starving - now.keys()):
            self._gauge.remove(queue, type_)
            log.info("jobs of type %s in queue %s are being claimed again", type_, queue)
        for key, unclaimed in now.items():
            self._gauge.labels(*key).set(unclaimed.pending)
            if key not in self._starving:
                log.warning(
                    "%s%d PENDING job(s) of type %s in queue %s have been due for over %.0f s "
                    "(the oldest since %s) and no worker claimed them: is a worker with a "
                    "handler for %s on queue %s running, with free slots?",
                    "at least " if unclaimed.at_least else "",
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
