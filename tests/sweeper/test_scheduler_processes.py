"""Three real `evora sweeper` processes, killed with SIGKILL again and again (and all at once
for a while) during schedules that tick every second: every tick makes exactly one job under
`catch_up`, and after the downtime `skip` and `run_once` make what they promise."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import asyncpg

from evora.domain.misfire import Misfire
from evora.storage.jobs import JobStore
from evora.storage.schedules import ScheduleStore
from tests.polling import until
from tests.sweeper.test_scheduler import spec, ticks

# Longer than the machine may stall every scheduler at once: under load all three made a
# tick 4.8 s late between kills, a second outage to the policies. DOWN leaves five ticks
# later than the grace in the downtime.
GRACE = 6  # seconds
DOWN = 12.0  # seconds with no scheduler at all
EVERY_SECOND = "* * * * * *"  # the seconds field exists for tests only


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Sweepers:
    def __init__(self, db_url: str, log: Path) -> None:
        self._db_url = db_url
        self._log = log
        self.processes: list[subprocess.Popen[bytes] | None] = [None, None, None]
        self.ports = [0, 0, 0]
        self.kills = 0

    def start(self, index: int) -> None:
        self.ports[index] = _free_port()
        env = {
            **os.environ,
            "EVORA_DATABASE_URL": self._db_url,
            "EVORA_AUTH": "disabled",
            "EVORA_SWEEPER_PORT": str(self.ports[index]),
        }
        with self._log.open("ab") as out:
            self.processes[index] = subprocess.Popen(
                [sys.executable, "-m", "evora_services.cli", "sweeper"],
                env=env,
                stdout=out,
                stderr=out,
            )

    def kill(self, index: int) -> None:
        process = self.processes[index]
        if process is not None:
            process.send_signal(signal.SIGKILL)
            process.wait(10)
            self.kills += 1
            self.processes[index] = None

    async def serving(self, index: int) -> None:
        """Until the process answers on its port: its scheduler runs from then on (the
        app starts its background tasks before it listens)."""
        url = f"http://127.0.0.1:{self.ports[index]}/healthz"

        async def answers() -> bool:
            process = self.processes[index]
            assert process is not None and process.poll() is None, self._log.read_text()[-3000:]
            try:
                async with aiohttp.ClientSession() as http, http.get(url) as response:
                    return response.status == 200
            except aiohttp.ClientError:
                return False

        await until(answers, f"sweeper {index} to serve", within=60)

    async def churn(self, kills: int, rng: random.Random) -> None:
        """Kill one at a time and start it again, the next kill only once it serves again,
        so two schedulers always run."""
        for _ in range(kills):
            await asyncio.sleep(rng.uniform(0.3, 1.2))
            victim = rng.randrange(3)
            self.kill(victim)
            self.start(victim)
            await self.serving(victim)

    def stop(self) -> None:
        for process in self.processes:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            if process is not None:
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()


async def _jobs(pool: asyncpg.Pool, name: str) -> dict[datetime, float]:
    """tick -> how late its job was made (seconds), for the schedule's jobs."""
    rows = await pool.fetch(
        "SELECT idempotency_key, created_at FROM evora.jobs WHERE idempotency_key LIKE $1",
        f"schedule:{name}:%",
    )
    made = {}
    for row in rows:
        tick = datetime.fromisoformat(row["idempotency_key"].removeprefix(f"schedule:{name}:"))
        made[tick] = (row["created_at"] - tick).total_seconds()
    return made


async def test_sigkilled_schedulers_make_each_tick_once(
    db_url: str, pool: asyncpg.Pool, store: JobStore, tmp_path: Path
) -> None:
    log = tmp_path / "sweepers.log"
    rng = random.Random(1515)
    schedules = ScheduleStore(pool, store)
    start = datetime.now(UTC)
    for policy in Misfire:
        await schedules.put(
            policy.value, spec(EVERY_SECOND, policy, misfire_grace_seconds=GRACE), start
        )
    sweepers = Sweepers(db_url, log)
    try:
        for index in range(3):
            sweepers.start(index)
        for index in range(3):
            await sweepers.serving(index)
        await sweepers.churn(4, rng)
        down_from = datetime.now(UTC)
        for index in range(3):
            sweepers.kill(index)
        await asyncio.sleep(DOWN)
        down_until = datetime.now(UTC)
        for index in range(3):
            sweepers.start(index)
        await sweepers.churn(4, rng)
        end = datetime.now(UTC)

        async def handled() -> bool:
            due = await pool.fetchval("SELECT min(ticked_until) FROM evora.schedules")
            return bool(due >= end)

        await until(handled, "every schedule to be handled up to the end", within=60)
    finally:
        sweepers.stop()
    assert sweepers.kills == 4 + 3 + 4
    assert "Traceback" not in log.read_text(errors="replace"), log.read_text()[-3000:]

    every = ticks(EVERY_SECOND, "UTC", start, end)
    assert len(every) >= DOWN  # the downtime alone (the churn before and after adds more)
    catch_up = await _jobs(pool, "catch_up")
    assert sorted(t for t in catch_up if t <= end) == every  # each tick once, none missed

    after_downtime = [t for t in every if t > down_from + timedelta(seconds=1)]
    deep = [t for t in after_downtime if t <= down_until - timedelta(seconds=GRACE)]
    assert len(deep) >= 4
    for name in ("skip", "run_once"):
        made = await _jobs(pool, name)
        first = min(t for t in made if t > down_from + timedelta(seconds=1))
        # from its first job after the downtime on, every tick has one
        assert [t for t in after_downtime if t >= first] == sorted(
            t for t in made if first <= t <= end
        ), name
        # a job made on time is made well within the grace; a late one at or after it
        on_time = [t for t in made if t > first and t <= end]
        assert all(made[t] < GRACE + 0.5 for t in on_time), made
        if name == "skip":
            assert first > deep[-1] and made[first] < GRACE + 0.5, made  # late ticks: nothing
        else:
            # only the most recent late tick made a job
            assert made[first] >= GRACE and first >= deep[-1] - timedelta(seconds=1), made
