"""What `evora migrate --check` reports: where the database differs from what this code's
migrations and function files build.

Three records are compared, each cheaply: the applied migrations (`evora.migrations`) with
the migration files, the applied function files (`evora.function_files`) with the function
files, and Evora's objects in the catalog (tables, columns, indexes, constraints, triggers,
functions, types) with `objects.txt`, the same list read from a freshly migrated database
(generated with schema.sql, compared by tests/integration/test_schema.py). The first two
find what `evora migrate` would do or refuse; the third finds what no record shows: an
index dropped by hand, a table or function someone added, a column changed.
"""

from __future__ import annotations

from importlib import resources

import asyncpg

from evora.storage.migrate import (
    applied_function_files,
    applied_versions,
    available,
    function_files,
    unfinished_index_builds,
)
from evora.storage.statements import load

OBJECTS_FILE = "objects.txt"

(SCHEMA_OBJECTS,) = load("drift", "schema_objects")


def expected_objects() -> set[str]:
    """What a freshly migrated database holds (objects.txt, one object a line)."""
    text = resources.files("evora.storage").joinpath(OBJECTS_FILE).read_text("utf-8")
    return {line for line in text.splitlines() if line and not line.startswith("#")}


async def schema_objects(conn: asyncpg.Connection) -> set[str]:
    """Evora's objects in the database at `conn`, in objects.txt's words."""
    async with conn.transaction():
        # The catalog's functions print a name qualified unless the search_path finds it.
        await conn.execute("SELECT set_config('search_path', '', true)")
        return {row["object"] for row in await conn.fetch(SCHEMA_OBJECTS)}


async def drift(conn: asyncpg.Connection) -> list[str]:
    """Every difference between the database and this code, one sentence each; none when
    they agree."""
    found: list[str] = []
    applied = await applied_versions(conn)
    known = {m.version: m for m in available()}
    for version, migration in known.items():
        recorded = applied.get(version)
        name = f"migration {version:04d}_{migration.name}"
        if recorded is None:
            found.append(f"{name} is not applied (run `evora migrate`)")
        elif recorded != migration.checksum:
            found.append(f"{name} differs from the one applied (its file was edited)")
    found += [
        f"migration {version:04d} is applied but unknown to this code (a newer release's)"
        for version in sorted(set(applied) - set(known))
    ]

    recorded_files = await applied_function_files(conn)
    files = {file.name: file for file in function_files()}
    for name, file in files.items():
        recorded_file = recorded_files.get(name)
        if recorded_file is None:
            found.append(f"function file {name} is not applied (run `evora migrate`)")
        elif recorded_file[0] != file.checksum:
            found.append(
                f"function file {name} differs from the one applied (by a release that knew "
                f"migrations up to {recorded_file[1]:04d})"
            )
    found += [
        f"function file {name} is applied but unknown to this code"
        for name in sorted(set(recorded_files) - set(files))
    ]

    actual, expected = await schema_objects(conn), expected_objects()
    found += [f"missing {thing}" for thing in sorted(expected - actual)]
    found += [f"unexpected {thing}" for thing in sorted(actual - expected)]
    if set(known) <= set(applied):
        found += [
            f"index {index} is left to the next `evora migrate` (it builds them CONCURRENTLY "
            "after an upgrade's migrations; run it again)"
            for index in await unfinished_index_builds(conn)
        ]
    return found
