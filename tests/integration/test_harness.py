"""The fixtures hand out real, migrated, isolated servers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from pymongo import AsyncMongoClient


async def test_db_url_is_migrated(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        applied = await conn.fetchval("SELECT count(*) FROM evora.migrations")
    finally:
        await conn.close()
    assert applied > 0


async def test_test_databases_are_isolated(
    db_url: str, make_db_url: Callable[[], Awaitable[str]]
) -> None:
    other_url = await make_db_url()
    first = await asyncpg.connect(db_url)
    other = await asyncpg.connect(other_url)
    try:
        await first.execute("CREATE TABLE only_here (id int)")
        assert await first.fetchval("SELECT to_regclass('only_here') IS NOT NULL")
        assert not await other.fetchval("SELECT to_regclass('only_here') IS NOT NULL")
    finally:
        await first.close()
        await other.close()


async def test_mongo_round_trip(mongo_url: str, mongo_db_name: str) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    try:
        things = client[mongo_db_name]["things"]
        await things.insert_one({"_id": "a", "n": 1})
        assert await things.find_one({"_id": "a"}) == {"_id": "a", "n": 1}
    finally:
        await client.close()
