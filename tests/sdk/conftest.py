from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from evora import Client, RetryBackoff
from tests.sdk.fake import ADMIN_TOKEN, FakeEvora

# Retries in tests wait milliseconds, not the production defaults.
FAST = RetryBackoff(initial=0.01, max_delay=0.05)


@pytest.fixture
async def fake() -> AsyncIterator[FakeEvora]:
    server = FakeEvora()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def client(fake: FakeEvora) -> AsyncIterator[Client]:
    async with Client(fake.url, ADMIN_TOKEN, timeout=5, retries=2, retry_backoff=FAST) as c:
        yield c
