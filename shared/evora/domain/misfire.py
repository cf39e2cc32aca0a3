"""Which due ticks of a schedule make jobs (docs/schedules.md#missed-ticks).

A tick is *late* when it is handled `grace` or more after it. While schedulers run, ticks are
handled on time and every one makes a job. After downtime the policy decides:

- `skip`: late ticks make nothing;
- `run_once`: of the late ticks, only the most recent makes a job;
- `catch_up`: every due tick makes a job, the most recent `CATCH_UP_LIMIT` at most.

Ticks passed over are *missed*. `plan` handles a bounded number of ticks per call (one
transaction of the scheduler), so a long downtime is worked off in many short steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from evora.domain.cron import CronSchedule

CATCH_UP_LIMIT = 1000
# Per step: jobs made (one statement each), and ticks passed over (only arithmetic).
FIRE_BATCH = 100
MISSED_BATCH = 10_000

_NEVER = datetime.max.replace(tzinfo=UTC)


class Misfire(StrEnum):
    SKIP = "skip"
    RUN_ONCE = "run_once"
    CATCH_UP = "catch_up"


@dataclass(frozen=True)
class Step:
    fire: list[datetime]  # ticks that make a job, oldest first
    missed: int  # ticks passed over
    ticked_until: datetime  # every tick at or before this is handled after the step


def _first_kept(
    schedule: CronSchedule,
    misfire: Misfire,
    grace: timedelta,
    ticked_until: datetime,
    now: datetime,
) -> datetime:
    """The earliest due tick that makes a job: those before it are missed."""
    late_until = now - grace  # a tick at or before this is late
    if misfire is Misfire.SKIP:
        return schedule.next_after(late_until) or _NEVER
    if misfire is Misfire.RUN_ONCE:
        latest_late = schedule.latest_at_or_before(late_until)
        return latest_late if latest_late is not None else ticked_until
    # catch_up: walk back from now over at most CATCH_UP_LIMIT due ticks
    kept = ticked_until
    tick = schedule.latest_at_or_before(now)
    for _ in range(CATCH_UP_LIMIT):
        if tick is None or tick <= ticked_until:
            break
        kept = tick
        tick = schedule.latest_at_or_before(tick - timedelta(microseconds=1))
    return kept


def plan(
    schedule: CronSchedule,
    misfire: Misfire,
    grace: timedelta,
    ticked_until: datetime,
    now: datetime,
    *,
    fire_batch: int = FIRE_BATCH,
    missed_batch: int = MISSED_BATCH,
) -> Step:
    """The next step over the ticks in (ticked_until, now]."""
    kept = _first_kept(schedule, misfire, grace, ticked_until, now)
    fire: list[datetime] = []
    missed = 0
    handled = ticked_until
    while len(fire) < fire_batch and missed < missed_batch:
        tick = schedule.next_after(handled)
        if tick is None or tick > now:
            break
        if tick < kept:
            missed += 1
        else:
            fire.append(tick)
        handled = tick
    return Step(fire, missed, handled)
