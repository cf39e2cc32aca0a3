"""Fixtures shared by the integration tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
from asyncpg.connection import LoggedQuery

from evora.storage import queries
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore


@pytest.fixture
async def logged() -> list[str]:
    return []


@contextlib.asynccontextmanager
async def own_store(
    db_url: str,
    *,
    max_size: int,
    generic_plans: bool = False,
    log: Callable[[LoggedQuery], None] | None = None,
) -> AsyncIterator[JobStore]:
    """A store on a pool of its own; `log` is given every statement the pool's first
    connection sends (with `max_size=1` the pool's one connection, for the whole test)."""
    pool = await create_pool(db_url, min_size=1, max_size=max_size, generic_plans=generic_plans)
    if log is not None:
        async with pool.acquire() as conn:
            conn.add_query_logger(log)
    store = JobStore(pool)
    try:
        yield store
    finally:
        await store.close()
        await pool.close()


@pytest.fixture
async def counted_store(db_url: str, logged: list[str]) -> AsyncIterator[JobStore]:
    """A store on one connection that records every statement of evora.storage.queries it
    sends (asyncpg's own type introspection left out)."""
    ours = {v for v in vars(queries).values() if isinstance(v, str)}

    def log(record: LoggedQuery) -> None:
        if record.query in ours:
            logged.append(record.query)

    async with own_store(db_url, max_size=1, log=log) as store:
        yield store
