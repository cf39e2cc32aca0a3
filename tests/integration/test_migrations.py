from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from evora.storage import migrate
from evora.storage.migrate import MigrationError, apply_migrations, latest_version


async def _empty_database(make_db_url: Callable[[], Awaitable[str]]) -> str:
    dsn = await make_db_url()
    conn = await asyncpg.connect(dsn)
    try:  # start from nothing, not from the migrated template
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    finally:
        await conn.close()
    return dsn


async def test_second_run_is_a_no_op(make_db_url: Callable[[], Awaitable[str]]) -> None:
    dsn = await _empty_database(make_db_url)
    assert await apply_migrations(dsn) == [m.version for m in migrate.available()]
    assert await apply_migrations(dsn) == []


async def test_concurrent_runs_apply_each_migration_once(
    make_db_url: Callable[[], Awaitable[str]],
) -> None:
    dsn = await _empty_database(make_db_url)
    results = await asyncio.gather(*(apply_migrations(dsn) for _ in range(4)))
    assert sorted(results, key=len)[-1] == [m.version for m in migrate.available()]
    assert sum(len(r) for r in results) == len(migrate.available())
    conn = await asyncpg.connect(dsn)
    try:
        assert await migrate.current_version(conn) == latest_version()
    finally:
        await conn.close()


async def test_edited_migration_is_refused(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("UPDATE evora_migrations SET checksum = 'edited' WHERE version = 1")
    finally:
        await conn.close()
    with pytest.raises(MigrationError, match="changed after it was applied"):
        await apply_migrations(db_url)
