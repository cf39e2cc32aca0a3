"""The projector process: health, readiness and metrics on EVORA_PROJECTOR_PORT, the
leadership lock, the NOTIFY listener and the projection loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from evora.config import Settings
from evora.http.app import METRICS, READINESS, also_unavailable, create_base_app, open_pool
from evora.readmodels.client import MONGO_UNAVAILABLE, mongo_client, mongo_ready
from evora.storage import locks
from evora.storage.leadership import AdvisoryLeader
from evora.storage.listener import Listener
from evora_services.projector.metrics import ProjectorMetrics
from evora_services.projector.service import ProjectorService

SERVICE = web.AppKey("projector", ProjectorService)


async def create_app(settings: Settings) -> web.Application:
    settings.require("database_url", "mongo_url")
    mongo_url = settings.mongo_url
    assert mongo_url is not None
    session_dsn, session_pooler = settings.require_session_database("the projector's leadership")
    app = create_base_app(settings, "projector", "Evora projector")
    also_unavailable(app, MONGO_UNAVAILABLE)
    metrics = ProjectorMetrics(app[METRICS])

    async def resources(app: web.Application) -> AsyncIterator[None]:
        pool = await open_pool(app, "projector")
        client = mongo_client(mongo_url, "evora-projector")

        app[READINESS].append(mongo_ready(client))
        service = ProjectorService(pool, client[settings.mongo_db], metrics)
        app[SERVICE] = service
        leader = AdvisoryLeader(
            session_dsn,
            locks.PROJECTOR,
            name="evora-projector-leader",
            on_change=lambda active: metrics.active.set(1 if active else 0),
            pooler=session_pooler,
        )
        # The lock and LISTEN go the same way: the leadership needs it (create_app refused
        # to start without it), and then hints come free.
        listener = Listener(
            session_dsn,
            on_notify=lambda _queue: service.wake.set(),
            on_reconnect=service.wake.set,
            name="evora-projector-listen",
            pooler=session_pooler,
        )
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(leader.run(service.lead, stop)),
            asyncio.create_task(listener.run()),
        ]
        try:
            yield
        finally:
            stop.set()  # the leader finishes its batch and releases the lock
            await tasks[0]
            tasks[1].cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tasks[1]
            await client.close()
            await pool.close()

    app.cleanup_ctx.append(resources)
    return app
