from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from evora.storage.db import create_pool
from evora.storage.jobs import JobStore


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(db_url, min_size=1, max_size=8)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
def store(pool: asyncpg.Pool) -> JobStore:
    return JobStore(pool)
