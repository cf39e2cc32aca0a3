from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from evora import Client, RetryBackoff
from tests.sdk.fake import FaultProxy
from tests.servers import ADMIN_TOKEN, Services

# Retries in tests wait milliseconds, not the production defaults.
FAST = RetryBackoff(initial=0.01, max_delay=0.05)


@pytest.fixture
async def proxy(services: Services) -> AsyncIterator[FaultProxy]:
    """The real services behind a proxy that can fail on cue (tests/sdk/fake.py)."""
    server = FaultProxy(services)
    await server.start()
    yield server
    await server.close()


@pytest.fixture
async def client(services: Services) -> AsyncIterator[Client]:
    """An admin's client of the real api."""
    async with Client(services.api.url, ADMIN_TOKEN, timeout=5, retries=2, retry_backoff=FAST) as c:
        yield c


@pytest.fixture
async def proxied_client(proxy: FaultProxy) -> AsyncIterator[Client]:
    """An admin's client of the real api, through the proxy."""
    async with Client(proxy.url, ADMIN_TOKEN, timeout=5, retries=2, retry_backoff=FAST) as c:
        yield c
