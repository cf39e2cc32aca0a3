"""`evora projector` and `evora projector --rebuild`."""

from __future__ import annotations

import asyncio
import sys

from evora.config import Settings
from evora.http.serve import run_service
from evora.readmodels.client import mongo_client
from evora.storage.db import create_pool
from evora_services.projector.app import create_app
from evora_services.projector.projector import AbandonedRebuild
from evora_services.projector.service import rebuild


def run(settings: Settings) -> int:
    settings.require("database_url", "mongo_url")
    return run_service(
        lambda: create_app(settings),
        name="projector",
        host=settings.bind_host,
        port=settings.projector_port,
    )


def run_rebuild(settings: Settings) -> int:
    settings.require("database_url", "mongo_url")
    assert settings.database_url is not None and settings.mongo_url is not None
    dsn, url = settings.database_url, settings.mongo_url

    async def main() -> tuple[int, int]:
        pool = await create_pool(
            dsn,
            application_name="evora-projector-rebuild",
            max_size=2,
            pooler=settings.database_pooler,
        )
        client = mongo_client(url, "evora-projector-rebuild")
        try:
            return await rebuild(pool, client[settings.mongo_db])
        finally:
            await client.close()
            await pool.close()

    try:
        generation, applied = asyncio.run(main())
    except AbandonedRebuild as exc:
        print(f"error: the rebuild stopped: {exc}", file=sys.stderr)
        return 1
    print(f"read models rebuilt as generation {generation} from {applied} events; now active")
    return 0
