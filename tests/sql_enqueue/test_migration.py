"""Migration 0011 can run again over itself, on a database that has it and in a second
database of the same server (where the role already exists), changing nothing; and over a
newer database without leaving two versions of a function side by side."""

from __future__ import annotations

from importlib import resources

import asyncpg
import pytest

from evora.storage.migrate import NAMESPACE_VERSION, apply_migrations
from tests.sql_enqueue.conftest import MakeRole

# The last version before a later migration (0013) replaced functions of 0011: running 0011
# again over a newer database puts its own versions back, as any older migration would.
_FUNCTIONS_OF_0011_UNTIL = 12


@pytest.fixture
async def db_url(empty_db_url: str) -> str:
    """A database migrated up to the version whose functions 0011 still defines."""
    await apply_migrations(empty_db_url, upto=_FUNCTIONS_OF_0011_UNTIL)
    return empty_db_url


@pytest.fixture
async def newest_named_by_0011_url(empty_db_url: str) -> str:
    """A database at the newest schema whose objects 0011 names: the one before migration
    0030 moved every table and function it uses into `evora`, renaming them (an old
    migration's text names the objects of its own time)."""
    await apply_migrations(empty_db_url, upto=NAMESPACE_VERSION - 1)
    return empty_db_url


_STATE = """
SELECT (SELECT array_agg(f ORDER BY f) FROM (
            SELECT p.oid::regprocedure::text || ' ' || md5(pg_get_functiondef(p.oid)) || ' '
                   || coalesce(p.proacl::text, '') || ' ' || coalesce(p.proconfig::text, '')
            FROM pg_proc p WHERE p.pronamespace = 'evora'::regnamespace) AS x(f)),
       (SELECT nspacl::text FROM pg_namespace WHERE nspname = 'evora'),
       (SELECT rolcanlogin FROM pg_roles WHERE rolname = 'evora_producer')
"""


def _migration() -> str:
    folder = resources.files("evora.storage.migrations")
    return folder.joinpath("0011_submit_in_sql.sql").read_text("utf-8")


async def test_applying_it_again_changes_nothing(
    app_conn: asyncpg.Connection, make_role: MakeRole
) -> None:
    before = await app_conn.fetchrow(_STATE)
    assert before[2] is False  # NOLOGIN
    await app_conn.execute(_migration())
    assert await app_conn.fetchrow(_STATE) == before
    # and what it granted still works
    conn = await asyncpg.connect(await make_role("evora_producer"))
    try:
        assert await conn.fetchval("SELECT evora.submit('q', 't')") is not None
    finally:
        await conn.close()


async def test_applying_it_again_over_the_newest_schema_leaves_no_overloads(
    newest_named_by_0011_url: str,
) -> None:
    """A later migration that changes the arguments of a function 0011 defines gives the new
    version another name: 0011 run again re-creates its own, and a call with its arguments
    must not then match two functions."""
    conn = await asyncpg.connect(newest_named_by_0011_url)
    try:
        await conn.execute(_migration())
        overloaded = await conn.fetch(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'evora'::regnamespace "
            "GROUP BY proname HAVING count(*) > 1"
        )
        assert overloaded == []
        assert await conn.fetchval("SELECT evora.submit('q', 't')") is not None
    finally:
        await conn.close()
