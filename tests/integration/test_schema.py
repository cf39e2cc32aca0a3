"""shared/evora/storage/schema.sql is what the migrations and the function files build: every
migration applied to a brand-new database, then every function file, dumps (normalised) to
exactly that file; so does a database the migrations alone built (as Evora did before the
function files) once `evora migrate` runs again. objects.txt lists the same schema's objects
as `evora migrate --check` compares them."""

from __future__ import annotations

import difflib

import asyncpg
import pytest

from evora.storage.migrate import (
    apply_migrations,
    function_files,
    latest_version,
    stale_function_files,
)
from tests import schemadump


def _assert_builds_schema_sql(dsn: str) -> None:
    built, kept = schemadump.dump(dsn), schemadump.expected()
    if built != kept:
        diff = "".join(
            difflib.unified_diff(
                kept.splitlines(keepends=True),
                built.splitlines(keepends=True),
                "schema.sql",
                "migrations",
            )
        )
        print(diff)
        pytest.fail(
            "the migrations build another schema than shared/evora/storage/schema.sql "
            "(diff printed above); if the migrations are right, regenerate it with "
            "`python -m tests.schemadump`"
        )


async def test_the_migrations_build_exactly_schema_sql(empty_db_url: str) -> None:
    await apply_migrations(empty_db_url)
    _assert_builds_schema_sql(empty_db_url)


async def test_objects_txt_lists_what_the_migrations_build(empty_db_url: str) -> None:
    # What `evora migrate --check` expects, read the way it reads a database it checks.
    await apply_migrations(empty_db_url)
    built = await schemadump.objects(empty_db_url)
    assert built == schemadump.OBJECTS_FILE.read_text("utf-8"), (
        "the migrations build other objects than shared/evora/storage/objects.txt lists; if "
        "they are right, regenerate it with `python -m tests.schemadump`"
    )


async def test_an_install_the_migrations_alone_built_gets_the_function_files(
    empty_db_url: str,
) -> None:
    # Every numbered migration and no function file: what `evora migrate` left before the
    # files existed (a partial run applies no file either).
    await apply_migrations(empty_db_url, upto=latest_version())
    conn = await asyncpg.connect(empty_db_url)
    try:
        assert await stale_function_files(conn) == [f.name for f in function_files()]
        await apply_migrations(empty_db_url)
        assert await stale_function_files(conn) == []
    finally:
        await conn.close()
    _assert_builds_schema_sql(empty_db_url)


def test_normalising_drops_only_what_varies_between_dumps() -> None:
    dump = (
        "--\n-- PostgreSQL database dump\n--\n\\restrict AbC123\nSET lock_timeout = 0;\n"
        "SELECT pg_catalog.set_config('search_path', '', false);\n\n\n\n"
        "CREATE TABLE public.t (\n    a integer\n);\n"
        "CREATE FUNCTION public.f() RETURNS void\n    SET search_path TO 'public'\n"
        "    AS $$ SELECT 1 $$;\n\\unrestrict AbC123\n"
    )
    assert schemadump.normalise(dump) == (
        "CREATE TABLE public.t (\n    a integer\n);\n"
        "CREATE FUNCTION public.f() RETURNS void\n    SET search_path TO 'public'\n"
        "    AS $$ SELECT 1 $$;\n"
    )
