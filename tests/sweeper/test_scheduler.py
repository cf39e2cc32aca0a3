"""The scheduler on a real PostgreSQL with a clock the test moves: exactly one job per tick
with several schedulers racing (and dying mid-step) over many ticks, the misfire policies
after downtime, pause and resume, and what each job and event says about its tick."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from evora.domain.cron import CronSchedule
from evora.domain.misfire import CATCH_UP_LIMIT, Misfire
from evora.http.metrics import ServiceMetrics
from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.schedules import ScheduleSpec, ScheduleStore, rfc3339
from evora_services.sweeper.metrics import SweeperMetrics
from evora_services.sweeper.scheduler import Scheduler
from tests.polling import until
from tests.sweeper.clock import FakeClock

START = datetime(2026, 3, 28, 22, 0, 30, tzinfo=UTC)  # Berlin springs forward in 2 h


def spec(cron: str, misfire: Misfire = Misfire.CATCH_UP, **fields: Any) -> ScheduleSpec:
    values: dict[str, Any] = {
        "cron": cron,
        "timezone": "UTC",
        "job": {"queue": "scheduled", "type": "tick", "payload": {"n": 1}},
        "misfire": misfire,
        "misfire_grace_seconds": 60,
        "paused": False,
    }
    values.update(fields)
    return ScheduleSpec(**values)


def ticks(cron: str, zone: str, after: datetime, until: datetime) -> list[datetime]:
    schedule = CronSchedule.of(cron, zone, with_seconds=True)
    found = []
    tick = schedule.next_after(after)
    while tick is not None and tick <= until:
        found.append(tick)
        tick = schedule.next_after(tick)
    return found


async def made(pool: asyncpg.Pool, name: str) -> Counter[str]:
    """The ticks (RFC 3339) of the schedule's jobs, counted."""
    rows = await pool.fetch(
        "SELECT idempotency_key FROM evora.jobs WHERE idempotency_key LIKE $1", f"schedule:{name}:%"
    )
    return Counter(r["idempotency_key"].removeprefix(f"schedule:{name}:") for r in rows)


@dataclass
class Replica:
    pool: asyncpg.Pool
    jobs: JobStore
    scheduler: Scheduler
    base: ServiceMetrics

    def counted(self, what: str) -> float:
        return self.base.registry.get_sample_value(f"evora_schedule_ticks_{what}_total") or 0.0

    def failures(self, reason: str) -> float:
        value = self.base.registry.get_sample_value(
            "evora_schedule_failures_total", {"reason": reason}
        )
        return value or 0.0


@pytest.fixture
async def replicas() -> AsyncIterator[list[Replica]]:
    made: list[Replica] = []

    yield made
    for replica in made:
        await replica.jobs.close()
        await replica.pool.close()


async def replica(db_url: str, replicas: list[Replica], clock: FakeClock) -> Replica:
    pool = await create_pool(db_url, min_size=1, max_size=2)
    jobs = JobStore(pool)
    base = ServiceMetrics("sweeper")
    scheduler = Scheduler(ScheduleStore(pool, jobs), SweeperMetrics(base), clock)
    made = Replica(pool, jobs, scheduler, base)
    replicas.append(made)
    return made


async def test_racing_schedulers_make_exactly_one_job_per_tick(
    db_url: str, pool: asyncpg.Pool, store: JobStore, replicas: list[Replica]
) -> None:
    """Three scheduler loops on one clock, one of them killed (its task cancelled, mid-step
    or not) and restarted now and then, while the clock jumps by up to several ticks:
    every tick of every schedule has exactly one job, across a daylight-saving change."""
    rng = random.Random(15)
    clock = FakeClock(START)
    schedules = ScheduleStore(pool, store)
    plans = {
        "minutely": ("* * * * *", "UTC"),
        "berlin": ("*/7 0-4 * * *", "Europe/Berlin"),
        "lord-howe": ("15,45 * * * *", "Australia/Lord_Howe"),
    }
    for name, (cron, zone) in plans.items():
        await schedules.put(name, spec(cron, timezone=zone), clock.now())
    loops = [await replica(db_url, replicas, clock) for _ in range(3)]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(r.scheduler.run(stop)) for r in loops]
    kills = 0
    try:
        for _ in range(250):
            clock.advance(timedelta(seconds=rng.randint(1, 150)))
            await asyncio.sleep(rng.choice([0, 0, 0.001, 0.005]))
            if rng.random() < 0.1:
                victim = rng.randrange(3)
                tasks[victim].cancel()
                await asyncio.gather(tasks[victim], return_exceptions=True)
                tasks[victim] = asyncio.create_task(loops[victim].scheduler.run(stop))
                kills += 1

        async def all_handled() -> bool:
            # a loop that found a due schedule held by another waits a little (clock) time
            clock.advance(timedelta(milliseconds=1))
            due = await schedules.earliest_due()
            return due is not None and due > clock.now()

        await until(all_handled, "every due tick to be handled", within=60)
        end = clock.now()
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert kills > 10
    total = 0
    for name, (cron, zone) in plans.items():
        expected = [rfc3339(t) for t in ticks(cron, zone, START, end)]
        assert await made(pool, name) == Counter(expected), name
        total += len(expected)
    assert total > 350
    # the jobs were spread over the loops, and each counted what it made (a loop cancelled
    # between its commit and its count loses that count, as a killed process would)
    fired = [r.counted("fired") for r in loops]
    assert total - kills <= sum(fired) <= total
    assert sum(1 for f in fired if f > 0) >= 2


async def test_misfire_policies_after_downtime(
    db_url: str, pool: asyncpg.Pool, store: JobStore, replicas: list[Replica]
) -> None:
    clock = FakeClock(datetime(2026, 5, 1, 12, 0, 30, tzinfo=UTC))
    schedules = ScheduleStore(pool, store)
    for policy in Misfire:
        await schedules.put(policy.value, spec("*/10 * * * *", policy), clock.now())
    [one] = [await replica(db_url, replicas, clock)]

    # on time: every policy makes the tick's job
    clock.set(datetime(2026, 5, 1, 12, 10, 5, tzinfo=UTC))
    await one.scheduler.fire_due()
    for policy in Misfire:
        assert await made(pool, policy.value) == Counter(["2026-05-01T12:10:00Z"]), policy

    # down from 12:10:05 to 13:05: 12:20 ... 13:00 are late
    clock.set(datetime(2026, 5, 1, 13, 5, tzinfo=UTC))
    await one.scheduler.fire_due()
    late = [f"2026-05-01T{t}:00Z" for t in ("12:20", "12:30", "12:40", "12:50", "13:00")]
    assert await made(pool, "skip") == Counter(["2026-05-01T12:10:00Z"])
    assert await made(pool, "run_once") == Counter(["2026-05-01T12:10:00Z", late[-1]])
    assert await made(pool, "catch_up") == Counter(["2026-05-01T12:10:00Z", *late])
    assert one.counted("missed") == 5 + 4

    # back on time: a tick within the grace makes its job under every policy
    clock.set(datetime(2026, 5, 1, 13, 10, 59, tzinfo=UTC))
    await one.scheduler.fire_due()
    for policy in Misfire:
        assert "2026-05-01T13:10:00Z" in await made(pool, policy.value)
    # run_once after a downtime that ends within the grace of a tick: the most recent late
    # tick and the one on time
    clock.set(datetime(2026, 5, 1, 13, 40, 30, tzinfo=UTC))
    await one.scheduler.fire_due()
    run_once = await made(pool, "run_once")
    assert {"2026-05-01T13:30:00Z", "2026-05-01T13:40:00Z"} <= set(run_once)
    assert "2026-05-01T13:20:00Z" not in run_once
    assert "2026-05-01T13:40:00Z" in await made(pool, "skip")
    assert "2026-05-01T13:30:00Z" not in await made(pool, "skip")


async def test_catch_up_makes_at_most_the_most_recent_thousand(
    db_url: str, pool: asyncpg.Pool, store: JobStore, replicas: list[Replica]
) -> None:
    start = datetime(2026, 5, 1, tzinfo=UTC)
    clock = FakeClock(start)
    await ScheduleStore(pool, store).put("often", spec("* * * * *"), clock.now())
    one = await replica(db_url, replicas, clock)
    clock.advance(timedelta(minutes=1500, seconds=30))
    steps = await one.scheduler.fire_due()
    assert len(steps) > 1  # worked off in several short transactions
    every = [rfc3339(t) for t in ticks("* * * * *", "UTC", start, clock.now())]
    assert len(every) == 1500
    assert await made(pool, "often") == Counter(every[-CATCH_UP_LIMIT:])
    assert one.counted("missed") == 500


async def test_pause_resume_and_trigger(
    db_url: str, pool: asyncpg.Pool, store: JobStore, replicas: list[Replica]
) -> None:
    clock = FakeClock(datetime(2026, 5, 1, 12, 0, 30, tzinfo=UTC))
    schedules = ScheduleStore(pool, store)
    await schedules.put("p", spec("*/10 * * * *"), clock.now())
    one = await replica(db_url, replicas, clock)
    paused = await schedules.pause("p")
    assert paused["paused"] and paused["next_run_at"] is None
    clock.set(datetime(2026, 5, 1, 12, 35, tzinfo=UTC))
    assert await one.scheduler.fire_due() == []

    # a trigger makes a job now, paused or not, with a key of its own
    job = await schedules.trigger("p", clock.now())
    assert job["idempotency_key"].startswith("schedule:p:trigger:")
    [(data,)] = await pool.fetch(
        "SELECT data FROM evora.job_events WHERE job_id = $1 AND event = 'submitted'", job["id"]
    )
    assert data == {"schedule": "p", "triggered": True}
    after_trigger = await schedules.get("p")
    assert after_trigger["last_job_id"] == job["id"]

    # resumed: the ticks that fell while paused stay unmade (catch_up or not)
    resumed = await schedules.resume("p", clock.now())
    assert resumed["next_run_at"] == datetime(2026, 5, 1, 12, 40, tzinfo=UTC)
    clock.set(datetime(2026, 5, 1, 12, 40, 1, tzinfo=UTC))
    await one.scheduler.fire_due()
    assert await made(pool, "p") == Counter(
        [job["idempotency_key"].removeprefix("schedule:p:"), "2026-05-01T12:40:00Z"]
    )


async def test_tick_job_and_event_name_the_schedule_and_tick(
    db_url: str, pool: asyncpg.Pool, store: JobStore, replicas: list[Replica]
) -> None:
    clock = FakeClock(datetime(2026, 5, 1, 12, 0, 30, tzinfo=UTC))
    schedules = ScheduleStore(pool, store)
    await schedules.put("named", spec("5 12 * * *", timezone="Europe/Berlin"), clock.now())
    one = await replica(db_url, replicas, clock)
    clock.set(datetime(2026, 5, 2, 10, 5, 0, 500_000, tzinfo=UTC))  # 12:05 in Berlin
    await one.scheduler.fire_due()
    [row] = await pool.fetch(
        "SELECT j.id, j.idempotency_key, j.queue, j.payload, e.data FROM evora.jobs j "
        "JOIN evora.job_events e ON e.job_id = j.id AND e.event = 'submitted'"
    )
    assert row["idempotency_key"] == "schedule:named:2026-05-02T10:05:00Z"
    assert row["data"] == {"schedule": "named", "tick": "2026-05-02T10:05:00Z"}
    assert (row["queue"], row["payload"]) == ("scheduled", {"n": 1})
    current = await schedules.get("named")
    assert current["last_job_id"] == row["id"]
    assert current["last_run_at"] == datetime(2026, 5, 2, 10, 5, tzinfo=UTC)
    assert current["next_run_at"] == datetime(2026, 5, 3, 10, 5, tzinfo=UTC)
    # a job submitted by a producer in the same database carries no such data
    other = await store.submit(JobSubmission(queue="scheduled", type="t"))
    assert (
        await pool.fetchval("SELECT data FROM evora.job_events WHERE job_id = $1", other.job["id"])
        == {}
    )

    # putting it again (a clock behind the scheduler's) makes no tick twice
    await schedules.put("named", spec("5 12 * * *", timezone="Europe/Berlin"), START)
    assert (await schedules.get("named"))["next_run_at"] == datetime(2026, 5, 3, 10, 5, tzinfo=UTC)


async def test_a_tick_handled_twice_still_makes_one_job(
    db_url: str, pool: asyncpg.Pool, store: JobStore, replicas: list[Replica]
) -> None:
    """If the row were ever moved back (a stale writer, a restore), the tick's idempotency
    key is the last line: the second pass replays the job instead of making another."""
    clock = FakeClock(datetime(2026, 5, 1, 12, 0, 30, tzinfo=UTC))
    await ScheduleStore(pool, store).put("again", spec("*/10 * * * *"), clock.now())
    one = await replica(db_url, replicas, clock)
    clock.set(datetime(2026, 5, 1, 12, 10, 1, tzinfo=UTC))
    [first] = await one.scheduler.fire_due()
    await pool.execute(
        "UPDATE evora.schedules SET ticked_until = $1, next_run_at = $2",
        datetime(2026, 5, 1, 12, 0, 30, tzinfo=UTC),
        datetime(2026, 5, 1, 12, 10, tzinfo=UTC),
    )
    [second] = await one.scheduler.fire_due()
    assert [m.created for m in first.made + second.made] == [True, False]
    assert first.made[0].job_id == second.made[0].job_id
    assert await made(pool, "again") == Counter(["2026-05-01T12:10:00Z"])
    assert one.counted("fired") == 1


async def test_a_schedule_that_cannot_fire_fails_alone(
    db_url: str, pool: asyncpg.Pool, store: JobStore, replicas: list[Replica]
) -> None:
    """A schedule whose every firing is refused (here a `ref:` dependency, stored directly as
    a release that did not validate it at PUT would have) is due first at every tick. It
    records its error, counts it and waits for its next tick, instead of being taken first
    again and again while the healthy schedule behind it makes nothing: one scheduler's
    step by step, then two scheduler loops at once."""
    clock = FakeClock(datetime(2026, 5, 1, 12, 0, 30, tzinfo=UTC))
    schedules = ScheduleStore(pool, store)
    await schedules.put("healthy", spec("@hourly"), clock.now())
    await schedules.put("poison", spec("59 * * * *"), clock.now())
    await pool.execute(
        'UPDATE evora.schedules SET job = job || \'{"depends_on": ["ref:x"]}\' WHERE name ='
        " 'poison'"
    )
    loops = [await replica(db_url, replicas, clock) for _ in range(2)]

    async def check_poison(hour: int) -> None:
        poison = await schedules.get("poison")
        # moved past the tick it could not make, to its next one
        assert poison["next_run_at"] == datetime(2026, 5, 1, hour, 59, tzinfo=UTC)
        assert poison["consecutive_failures"] == hour - 12
        assert poison["failing_since"] == datetime(2026, 5, 1, 13, 0, 1, tzinfo=UTC)
        assert poison["last_error"]["type"] == "validation_error"
        assert "ref:x" in poison["last_error"]["message"]
        assert poison["last_error_at"] == clock.now()
        assert sum(r.failures("rejected") for r in loops) == hour - 12

    clock.set(datetime(2026, 5, 1, 13, 0, 1, tzinfo=UTC))
    steps = await loops[0].scheduler.fire_due()
    assert [(f.name, f.failure is not None) for f in steps] == [
        ("poison", True),
        ("healthy", False),
    ]
    assert await made(pool, "healthy") == Counter(["2026-05-01T13:00:00Z"])
    await check_poison(13)

    stop = asyncio.Event()
    tasks = [asyncio.create_task(r.scheduler.run(stop)) for r in loops]
    try:
        clock.set(datetime(2026, 5, 1, 14, 0, 1, tzinfo=UTC))

        async def healthy_made() -> bool:
            return "2026-05-01T14:00:00Z" in await made(pool, "healthy")

        async def poison_failed_again() -> bool:
            return bool((await schedules.get("poison"))["consecutive_failures"] == 2)

        await until(healthy_made, "the healthy schedule's 14:00 job", within=15)
        await until(poison_failed_again, "the poison schedule's second failure", within=15)
        await check_poison(14)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert await made(pool, "poison") == Counter()

    # put right, it fires again and is no longer failing (its last error stays on record)
    await schedules.put("poison", spec("59 * * * *"), clock.now())
    clock.set(datetime(2026, 5, 1, 14, 59, 1, tzinfo=UTC))
    [fired] = await loops[0].scheduler.fire_due()
    assert fired.name == "poison" and len(fired.made) == 1
    healed = await schedules.get("poison")
    assert (healed["consecutive_failures"], healed["failing_since"]) == (0, None)
    assert "ref:x" in healed["last_error"]["message"]


async def test_a_tick_into_a_full_queue_fails_alone_and_fires_again_once_there_is_room(
    db_url: str, pool: asyncpg.Pool, store: JobStore, replicas: list[Replica]
) -> None:
    """A tick is a submission: refused by the queue's max_pending (docs/flow-control.md,
    "Admission"), the firing fails and is recorded, and the schedule waits for its next tick."""
    clock = FakeClock(datetime(2026, 5, 1, 12, 0, 30, tzinfo=UTC))
    schedules = ScheduleStore(pool, store)
    await schedules.put("full", spec("@hourly"), clock.now())
    await schedules.put(
        "other", spec("@hourly", job={"queue": "free", "type": "tick"}), clock.now()
    )
    await pool.execute(
        "INSERT INTO evora.flow_limits (key, max_pending) VALUES ('queue:scheduled', 1)"
    )
    await store.submit(JobSubmission(queue="scheduled", type="manual"))
    loop = await replica(db_url, replicas, clock)

    clock.set(datetime(2026, 5, 1, 13, 0, 1, tzinfo=UTC))
    steps = await loop.scheduler.fire_due()
    assert sorted((f.name, f.failure is not None) for f in steps) == [
        ("full", True),
        ("other", False),
    ]
    full = await schedules.get("full")
    assert full["last_error"]["type"] == "queue_full"
    assert "'queue:scheduled'" in full["last_error"]["message"]
    assert full["next_run_at"] == datetime(2026, 5, 1, 14, 0, tzinfo=UTC)
    assert await made(pool, "full") == Counter()

    [job] = await store.claim(worker_id="w", queues=["scheduled"])
    assert job["type"] == "manual"
    clock.set(datetime(2026, 5, 1, 14, 0, 1, tzinfo=UTC))
    await loop.scheduler.fire_due()
    assert await made(pool, "full") == Counter(["2026-05-01T14:00:00Z"])
