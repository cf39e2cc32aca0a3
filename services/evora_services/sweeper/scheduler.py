"""The scheduler: makes the jobs of schedules as their ticks fall due (docs/schedules.md).

Every sweeper replica runs one, leader or not: which tick makes which job is decided by the
database (`ScheduleStore.fire_due`), so more replicas only mean that a tick is still on time
when one of them is down. Tick arithmetic uses `clock`, which tests replace to run through
many ticks without waiting for them.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Protocol

from evora.storage.schedules import Fired, ScheduleStore
from evora.waiting import Backoff, wait_until_set
from evora_services.sweeper.metrics import SweeperMetrics
from evora_services.sweeper.sweeper import log_failure

log = logging.getLogger(__name__)

# Waking a little after a tick, not at it: a timer may fire a hair early.
_MARGIN = timedelta(milliseconds=2)


class Clock(Protocol):
    def now(self) -> datetime: ...

    async def sleep_until(self, when: datetime, stop: asyncio.Event) -> None:
        """Return at `when`, or earlier once `stop` is set."""


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, when: datetime, stop: asyncio.Event) -> None:
        await wait_until_set(stop, (when - self.now()).total_seconds())


class Scheduler:
    def __init__(
        self,
        store: ScheduleStore,
        metrics: SweeperMetrics,
        clock: Clock,
        *,
        max_wait: float = 1.0,
        min_wait: float = 0.05,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._clock = clock
        # A schedule put (or resumed) elsewhere is seen within this, even while the
        # earliest known tick is far away.
        self._max_wait = timedelta(seconds=max_wait)
        # A due schedule that another replica holds (SKIP LOCKED) stays due until that
        # replica commits; this floor keeps the loop from spinning on it meanwhile.
        self._min_wait = timedelta(seconds=min_wait)

    async def fire_due(self) -> list[Fired]:
        """Steps until no due schedule is left that another replica does not hold."""
        steps = []
        while (fired := await self._store.fire_due(self._clock.now())) is not None:
            self._count(fired)
            steps.append(fired)
        return steps

    def _count(self, fired: Fired) -> None:
        now = self._clock.now()
        made = [m for m in fired.made if m.created]
        self._metrics.schedule_ticks_fired.inc(len(made))
        self._metrics.schedule_ticks_missed.inc(fired.step.missed)
        for m in made:
            self._metrics.schedule_fire_delay.observe(max((now - m.tick).total_seconds(), 0.0))
        if fired.failure is not None:
            self._metrics.schedule_failures.labels(fired.failure.reason.value).inc()
        if fired.step.missed:
            log.info("schedule %r: %d ticks missed by its policy", fired.name, fired.step.missed)

    async def run(self, stop: asyncio.Event) -> None:
        backoff = Backoff()
        while not stop.is_set():
            now = self._clock.now()
            wake = now + self._max_wait
            try:
                await self.fire_due()
                earliest = await self._store.earliest_due()
                if earliest is not None:
                    wake = max(min(wake, earliest + _MARGIN), now + self._min_wait)
                backoff.reset()
            except Exception as exc:
                wait = backoff.next()
                log_failure("scheduling", exc, wait)
                wake = now + timedelta(seconds=wait)
            await self._clock.sleep_until(wake, stop)
