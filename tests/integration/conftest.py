"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from evora.storage import queries
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore


@pytest.fixture
async def logged() -> list[str]:
    return []


@pytest.fixture
async def counted_store(db_url: str, logged: list[str]) -> AsyncIterator[JobStore]:
    """A store on one connection that records every statement of evora.storage.queries it
    sends (asyncpg's own type introspection left out)."""
    ours = {v for v in vars(queries).values() if isinstance(v, str)}

    pool = await create_pool(db_url, min_size=1, max_size=1)
    async with pool.acquire() as conn:  # the pool's one connection, for the whole test
        conn.add_query_logger(
            lambda record: logged.append(record.query) if record.query in ours else None
        )
    store = JobStore(pool)
    try:
        yield store
    finally:
        await store.close()
        await pool.close()
