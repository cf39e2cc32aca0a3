"""Migration 0011 can run again over itself, on a database that has it and in a second
database of the same server (where the role already exists), changing nothing."""

from __future__ import annotations

from importlib import resources

import asyncpg

from tests.sql.conftest import MakeRole

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
