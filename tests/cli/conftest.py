"""The api, dispatcher and projector on real PostgreSQL and MongoDB, in this process, for
the `evora` commands the tests run as child processes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from evora import Client
from evora.config import Settings
from evora_services.api.app import create_app as create_api
from evora_services.dispatcher.app import create_app as create_dispatcher
from evora_services.projector.app import create_app as create_projector
from tests.servers import Service, serve
from tests.typescript.conftest import node_tools  # noqa: F401  (test_readme's TypeScript blocks)

ADMIN_TOKEN = "cli-admin-token-0000"
PRODUCER_TOKEN = "cli-producer-token-0"
WORKER_TOKEN = "cli-worker-token-00"
TOKENS = f"admin:{ADMIN_TOKEN},producer:{PRODUCER_TOKEN},worker:{WORKER_TOKEN}"


@dataclass
class System:
    api: Service
    dispatcher: Service
    producer: Client

    def env(self, **extra: str) -> dict[str, str]:
        """What an operator's shell holds: the api's URL and an admin token."""
        return {"EVORA_API_URL": self.api.url, "EVORA_ADMIN_TOKEN": ADMIN_TOKEN, **extra}


@pytest.fixture
async def system(db_url: str, mongo_url: str, mongo_db_name: str) -> AsyncIterator[System]:
    settings = Settings(
        database_url=db_url, mongo_url=mongo_url, mongo_db=mongo_db_name, tokens=TOKENS
    )
    api = await serve(await create_api(settings), "api")
    dispatcher = await serve(
        await create_dispatcher(settings), "dispatcher", handler_cancellation=True
    )
    projector = await serve(await create_projector(settings), "projector")
    producer = Client(api.url, PRODUCER_TOKEN)
    try:
        yield System(api, dispatcher, producer)
    finally:
        await producer.close()
        for service in (projector, dispatcher, api):
            await service.close()
