"""The `evora api` application: the base app plus the job store and the section 4 routes."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from evora.config import Settings
from evora.http.app import create_base_app, open_pool
from evora.http.routing import install
from evora.storage.jobs import JobStore
from services.api.routes import STORE, admin, producer

SERVICE = "api"
TITLE = "Evora API"


async def _database(app: web.Application) -> AsyncIterator[None]:
    pool = await open_pool(app, SERVICE)
    app[STORE] = JobStore(pool)
    try:
        yield
    finally:
        await pool.close()


async def create_app(settings: Settings) -> web.Application:
    if settings.database_url is None:
        raise ValueError("the api needs settings.database_url")
    app = create_base_app(settings, SERVICE, TITLE)
    app.cleanup_ctx.append(_database)
    install(app, producer, admin)
    return app
