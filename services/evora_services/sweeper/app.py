"""The sweeper app: the shared base (/healthz, /readyz, /metrics), one pool for the sweeping
statements, and three background tasks: the leader (a dedicated lock connection; sweeps while
it holds the lock), and in every replica the health observer and the scheduler (which needs
no lock: the database makes each tick's job exactly once)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from evora.config import Settings
from evora.http.app import METRICS, create_base_app, open_pool
from evora.storage import locks
from evora.storage.jobs import JobStore
from evora.storage.leadership import AdvisoryLeader
from evora.storage.retention import RetentionStore
from evora.storage.schedules import ScheduleStore
from evora_services.sweeper.metrics import SweeperMetrics
from evora_services.sweeper.scheduler import Scheduler, SystemClock
from evora_services.sweeper.sweeper import Retention, Sweeper, Tuning

log = logging.getLogger(__name__)

SERVICE = "sweeper"
TITLE = "Evora sweeper"

SWEEPER = web.AppKey("sweeper", Sweeper)


async def create_app(settings: Settings, tuning: Tuning | None = None) -> web.Application:
    """`tuning` is for tests and benchmarks; production runs with the defaults."""
    settings.require("database_url")
    lock_dsn, lock_pooler = settings.require_session_database("the sweeper's leadership")
    tuning = tuning or Tuning()
    app = create_base_app(settings, SERVICE, TITLE)
    metrics = SweeperMetrics(app[METRICS])

    async def background(app: web.Application) -> AsyncIterator[None]:
        pool = await open_pool(app, SERVICE)
        store = JobStore(pool)
        sweeper = Sweeper(
            store, RetentionStore(pool), metrics, Retention.from_settings(settings), tuning
        )
        app[SWEEPER] = sweeper
        scheduler = Scheduler(
            ScheduleStore(pool, store),
            metrics,
            SystemClock(),
            max_wait=tuning.schedule_max_wait,
            min_wait=tuning.min_wait,
        )
        leader = AdvisoryLeader(
            lock_dsn,
            locks.SWEEPER,
            name="evora-sweeper-lock",
            standby_seconds=tuning.standby_seconds,
            on_change=sweeper.set_active,
            pooler=lock_pooler,
        )
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(leader.run(sweeper.lead, stop)),
            asyncio.create_task(sweeper.observe_forever(stop)),
            asyncio.create_task(scheduler.run(stop)),
        ]
        try:
            yield
        finally:
            # Graceful: current batches finish, the lock is released, then the pool closes.
            stop.set()
            await _finish(tasks, tuning.shutdown_grace)
            await store.close()
            await pool.close()

    app.cleanup_ctx.append(background)
    return app


async def _finish(tasks: list[asyncio.Task[None]], grace: float) -> None:
    done, pending = await asyncio.wait(tasks, timeout=grace)
    for task in pending:
        log.warning("sweeper task %s did not stop within %.0fs; cancelling", task, grace)
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("sweeper task failed", exc_info=error)
