"""The `evora api` application: the base app plus the job store and the producer and admin
routes."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from evora import tracing
from evora.config import Settings
from evora.http.app import (
    METRICS,
    READINESS,
    SETTINGS,
    TRACER,
    also_unavailable,
    create_base_app,
    open_pool,
)
from evora.http.routing import install
from evora.readmodels.client import MONGO_UNAVAILABLE, mongo_client, mongo_ready
from evora.readmodels.reader import ReadModels
from evora.storage.db import create_pool
from evora.storage.fairness import FairnessStore
from evora.storage.jobs import JobStore, coalescing
from evora.storage.limits import LimitStore
from evora.storage.schedules import ScheduleStore
from evora_services.api.callbacks import callbacks
from evora_services.api.dashboard import dashboard
from evora_services.api.fairness import FAIRNESS, fairness
from evora_services.api.limits import LIMITS, limits
from evora_services.api.reads import READS, Reads, answer_positions
from evora_services.api.routes import (
    ADMISSION_REFUSED,
    STORE,
    SUBMITS,
    admin,
    admission_refused,
    producer,
)
from evora_services.api.schedules import SCHEDULES, schedules
from evora_services.api.stats import READ_MODELS, stats
from evora_services.api.tracing import traced_submitter

SERVICE = "api"
TITLE = "Evora API"


async def _database(app: web.Application) -> AsyncIterator[None]:
    pool = await open_pool(app, SERVICE)
    store = JobStore(pool)
    app[STORE] = store
    app[SCHEDULES] = ScheduleStore(pool, store)
    app[LIMITS] = LimitStore(pool)
    app[FAIRNESS] = FairnessStore(pool)
    app[SUBMITS] = coalescing(traced_submitter(store))
    settings = app[SETTINGS]
    # Not part of /readyz: without the replica every read goes to the primary.
    replica_pool = (
        None
        if settings.read_database_url is None
        else await create_pool(
            settings.read_database_url,
            application_name=f"evora-{SERVICE}-reads",
            min_size=0,
            max_size=settings.db_pool_size,
            pooler=settings.database_pooler,
            read_only=True,
        )
    )
    app[READS] = Reads(store, pool, replica_pool, settings, app[METRICS].registry)
    try:
        yield
    finally:
        await app[SUBMITS].close()
        await store.close()
        await pool.close()
        if replica_pool is not None:
            await replica_pool.close()


async def _read_models(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    assert settings.mongo_url is not None
    client = mongo_client(settings.mongo_url, f"evora-{SERVICE}")
    app[READ_MODELS] = ReadModels(client[settings.mongo_db])
    app[READINESS].append(mongo_ready(client))
    try:
        yield
    finally:
        await client.close()


async def create_app(settings: Settings) -> web.Application:
    if settings.database_url is None:
        raise ValueError("the api needs settings.database_url")
    app = create_base_app(settings, SERVICE, TITLE)
    also_unavailable(app, MONGO_UNAVAILABLE)
    app[TRACER] = tracing.tracer("evora.api")
    app[ADMISSION_REFUSED] = admission_refused(app[METRICS].registry)
    app.middlewares.append(answer_positions)
    app.cleanup_ctx.append(_database)
    # Without MongoDB the api still serves jobs; the stats endpoints answer 503.
    if settings.mongo_url is not None:
        app.cleanup_ctx.append(_read_models)
    install(app, producer, admin, callbacks, schedules, limits, fairness, stats, dashboard)
    return app
