"""Entry point of `evora api`."""

from __future__ import annotations

import logging

from aiohttp import web

from evora.config import Settings
from evora.http.serve import run_service
from evora_services.api.app import create_app

log = logging.getLogger(__name__)


def run(settings: Settings) -> int:
    settings.require("database_url")
    if not settings.auth_enabled:
        log.warning(
            "EVORA_AUTH=disabled: every endpoint is open to anyone who can connect; "
            "listening on %s only",
            settings.bind_host,
        )

    async def factory() -> web.Application:
        return await create_app(settings)

    return run_service(factory, name="evora api", host=settings.bind_host, port=settings.api_port)
