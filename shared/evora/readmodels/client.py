"""The MongoDB client every service uses: timezone-aware, with bounded waits."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pymongo import AsyncMongoClient
from pymongo.errors import ConnectionFailure

from evora.readmodels.layout import Document

SERVER_SELECTION_MS = 5_000
CONNECT_MS = 5_000
SOCKET_MS = 30_000

# MongoDB (the read models) unreachable or not answering: the client may retry.
MONGO_UNAVAILABLE = ConnectionFailure


def mongo_client(url: str, app_name: str) -> AsyncMongoClient[Document]:
    return AsyncMongoClient(
        url,
        tz_aware=True,
        appname=app_name,
        serverSelectionTimeoutMS=SERVER_SELECTION_MS,
        connectTimeoutMS=CONNECT_MS,
        socketTimeoutMS=SOCKET_MS,
    )


def mongo_ready(client: AsyncMongoClient[Document]) -> Callable[[], Awaitable[str | None]]:
    """A readiness check: None when MongoDB answers a ping, else why not."""

    async def check() -> str | None:
        try:
            await client.admin.command("ping")
        except Exception as exc:  # any failure means "not ready", with the reason
            return f"MongoDB unreachable: {exc.__class__.__name__}"
        return None

    return check
