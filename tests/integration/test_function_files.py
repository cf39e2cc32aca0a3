"""Every database function and trigger has its current text in exactly one function file
(shared/evora/storage/functions/), and `evora migrate` re-applies a file whose text changed,
and only that file."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

import asyncpg

from evora.http.app import database_ready
from evora.storage.migrate import (
    NAMESPACE_VERSION,
    apply_migrations,
    function_files,
    latest_version,
    stale_function_files,
)


# Another text of a function of flow_limits.sql (its own returns a bucket's tokens), under
# its name and its argument's since migration 0030, or (`before_0030`) before it.
def _other_tokens(*, before_0030: bool = False) -> str:
    name, bucket = (
        ("evora_tokens", "flow_buckets") if before_0030 else ("evora.tokens", "evora.flow_buckets")
    )
    return f"""
CREATE OR REPLACE FUNCTION {name}(b {bucket}, rate_limit integer,
                                  rate_per_seconds float8, at timestamptz)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$ SELECT 0::float8 $$
"""


_TOKENS_SOURCE = "SELECT prosrc FROM pg_proc WHERE oid = $1::regproc"

_DEFINED = re.compile(r"^CREATE OR REPLACE (FUNCTION|TRIGGER) ([\w.]+)", re.MULTILINE)


async def test_every_function_and_trigger_is_defined_in_exactly_one_file(
    plain_conn: asyncpg.Connection,
) -> None:
    defined: list[str] = []
    for file in function_files():
        for kind, name in _DEFINED.findall(file.sql):
            qualified = name if "." in name or kind == "TRIGGER" else f"public.{name}"
            defined.append(f"{kind.lower()} {qualified}")
    in_db = await plain_conn.fetch(
        """
        SELECT 'function ' || n.nspname || '.' || p.proname AS object
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname IN ('public', 'evora')
          AND NOT EXISTS (SELECT FROM pg_depend d
                          WHERE d.objid = p.oid AND d.deptype = 'e')
        UNION ALL
        SELECT 'trigger ' || t.tgname FROM pg_trigger t
        WHERE NOT t.tgisinternal
          AND t.tgparentid = 0  -- job_events' partitions have their parent's row triggers
        """
    )
    # Counted with repeats: a name defined twice is two overloads in the database (the
    # previous release's signature of evora_claim_limited, kept for a rolling upgrade), or
    # a function defined in two files, which the database holds once.
    assert sorted(defined) == sorted(r["object"] for r in in_db)


async def test_a_changed_file_is_applied_again_and_only_it(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        source = await conn.fetchval(_TOKENS_SOURCE, "evora.tokens")
        # What the database holds after an older release: another text of a function of
        # flow_limits.sql, recorded with another checksum by code that knew fewer migrations.
        await conn.execute(_other_tokens())
        before = {
            r["name"]: r["applied_at"]
            for r in await conn.fetch("SELECT name, applied_at FROM evora.function_files")
        }
        await conn.execute(
            "UPDATE evora.function_files SET checksum = 'older', migration = $1 "
            "WHERE name = 'flow_limits'",
            latest_version() - 1,
        )
        assert await stale_function_files(conn) == ["flow_limits"]
        await apply_migrations(db_url)
        after = {
            r["name"]: r["applied_at"]
            for r in await conn.fetch("SELECT name, applied_at FROM evora.function_files")
        }
        assert {name for name in after if after[name] != before[name]} == {"flow_limits"}
        assert await stale_function_files(conn) == []
        assert source == await conn.fetchval(_TOKENS_SOURCE, "evora.tokens")
    finally:
        await conn.close()


async def test_files_follow_the_migrations_that_redefine_their_functions(
    make_db_url: Callable[[], Awaitable[str]], plain_conn: asyncpg.Connection
) -> None:
    # the file's text, as a database migrated from nothing holds it
    source = await plain_conn.fetchval(_TOKENS_SOURCE, "evora.tokens")
    dsn = await make_db_url()
    conn = await asyncpg.connect(dsn)
    try:  # start from nothing, not from the migrated template
        await conn.execute(
            "DROP SCHEMA evora CASCADE; DROP SCHEMA public CASCADE; CREATE SCHEMA public"
        )
        await apply_migrations(dsn, upto=NAMESPACE_VERSION - 1)
        # A release that knew fewer migrations (the last before the namespace) applied these
        # very files, and a function of
        # theirs has another text (as a migration that redefines it leaves it, like 0025 did
        # evora_claim_limited): the newest migration, applied now, makes every file run again.
        # (Where that release kept its record, and what it called the function.)
        await conn.execute(
            "CREATE TABLE evora_function_files (name text PRIMARY KEY, checksum text NOT NULL, "
            "migration integer NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        await conn.executemany(
            "INSERT INTO evora_function_files (name, checksum, migration) VALUES ($1, $2, $3)",
            [(f.name, f.checksum, NAMESPACE_VERSION - 1) for f in function_files()],
        )
        await conn.execute(_other_tokens(before_0030=True))
        await apply_migrations(dsn)
        assert source == await conn.fetchval(_TOKENS_SOURCE, "evora.tokens")
    finally:
        await conn.close()


async def test_readiness_asks_for_evora_migrate_while_a_file_is_stale(
    db_url: str, pool: asyncpg.Pool
) -> None:
    ready = database_ready(pool)
    assert await ready() is None
    await pool.execute("DELETE FROM evora.function_files WHERE name = 'retention'")
    assert await ready() == (
        "database functions are older than function files ['retention'] (run `evora migrate`)"
    )
    await apply_migrations(db_url)
    assert await ready() is None


async def test_an_older_release_leaves_the_files_a_newer_one_applied(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        # What a newer release (one more migration) leaves: its own text of flow_limits.sql.
        await conn.execute(
            "UPDATE evora.function_files SET checksum = 'newer', migration = $1 "
            "WHERE name = 'flow_limits'",
            latest_version() + 1,
        )
        before = await conn.fetchval(
            "SELECT applied_at FROM evora.function_files WHERE name = 'flow_limits'"
        )
        assert await stale_function_files(conn) == []
        await apply_migrations(db_url)
        assert await conn.fetchrow(
            "SELECT checksum, applied_at FROM evora.function_files WHERE name = 'flow_limits'"
        ) == ("newer", before)
    finally:
        await conn.close()
