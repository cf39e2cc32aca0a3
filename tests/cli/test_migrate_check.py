"""`evora migrate --check`: the drift between the database and the code, on a real database."""

from __future__ import annotations

import asyncpg

from evora.storage import drift
from tests.cli.commands import evora


async def test_a_freshly_migrated_database_has_no_drift(db_url: str) -> None:
    result = evora("migrate", "--check", env={"EVORA_DATABASE_URL": db_url})
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "the database is what this code's migrations and function files build\n"


async def test_every_kind_of_drift_is_named_and_exits_3(db_url: str) -> None:
    [dropped_index] = [
        line for line in drift.expected_objects() if line.startswith("index evora.jobs_finished ")
    ]
    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("DELETE FROM evora.migrations WHERE version = 29")
        await conn.execute("INSERT INTO evora.migrations VALUES (9999, 'from_the_future', 'x')")
        await conn.execute("UPDATE evora.migrations SET checksum = 'edited' WHERE version = 1")
        await conn.execute("UPDATE evora.function_files SET checksum = 'old' WHERE name = 'guards'")
        await conn.execute("DELETE FROM evora.function_files WHERE name = 'retention'")
        await conn.execute("CREATE TABLE evora.by_hand (id int)")
        # the database's own schema is its users': what is there is none of Evora's business
        await conn.execute("CREATE TABLE public.users_own (id int)")
        await conn.execute("CREATE FUNCTION evora.by_hand() RETURNS int LANGUAGE sql RETURN 1")
        await conn.execute("DROP INDEX evora.jobs_finished")
    finally:
        await conn.close()

    result = evora("migrate", "--check", env={"EVORA_DATABASE_URL": db_url})
    assert result.returncode == 3, result.stdout + result.stderr
    found = result.stdout.splitlines()
    for expected in [
        "migration 0029_function_row_estimates is not applied (run `evora migrate`)",
        "migration 0001_initial differs from the one applied (its file was edited)",
        "migration 9999 is applied but unknown to this code (a newer release's)",
        "function file retention is not applied (run `evora migrate`)",
        f"missing {dropped_index}",
        "unexpected table evora.by_hand",
        "unexpected column evora.by_hand.id integer",
        "unexpected function evora.by_hand()",
    ]:
        assert expected in found, result.stdout
    assert any(line.startswith("function file guards differs") for line in found), found
    assert not any("users_own" in line for line in found), found
