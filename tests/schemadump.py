"""The schema the migrations and the function files build, as the normalised `pg_dump
--schema-only` text kept in shared/evora/storage/schema.sql, which
tests/integration/test_schema.py compares with a freshly migrated database; and the list of
Evora's objects in shared/evora/storage/objects.txt, which `evora migrate --check` compares
with the database it checks.

After adding a migration or changing a function file, regenerate the file (it starts an
embedded PostgreSQL of its own):

    python -m tests.schemadump
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import asyncpg

from evora.embedded import LocalPostgres
from evora.embedded._pgbin import find_bin_dir
from evora.storage import drift
from evora.storage.migrate import apply_migrations

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "shared/evora/storage/schema.sql"
OBJECTS_FILE = SCHEMA_FILE.with_name(drift.OBJECTS_FILE)

HEADER = """\
-- The schema that shared/evora/storage/migrations/ and functions/ build, as pg_dump prints it
-- (normalised: no comments, no session settings; the functions' comments are in functions/).
-- Never edit by hand: a test compares it with a freshly migrated database; after adding a
-- migration or changing a function file, regenerate it with
--     python -m tests.schemadump
"""

# What varies between runs or servers and says nothing about the schema: pg_dump's comments,
# the session settings it opens with, and the random key of `\restrict` (PostgreSQL 17.6+).
_NOISE = re.compile(
    r"^(--.*|SET \w+ = .*;|SELECT pg_catalog\.set_config\(.*\);|\\(un)?restrict .*)$"
)


def normalise(dump: str) -> str:
    lines = [line.rstrip() for line in dump.splitlines() if not _NOISE.match(line.strip())]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return text + "\n"


def dump(dsn: str) -> str:
    """The normalised schema of the database at `dsn` (pg_dump beside the server binaries
    the tests run)."""
    pg_dump = find_bin_dir() / "pg_dump"
    out = subprocess.run(
        [
            str(pg_dump),
            "--schema-only",
            "--no-owner",
            "--no-privileges",
            # the outbox's partitions are named by the dates they hold: data, not schema
            "--exclude-table=evora.job_events_p*",
            "--exclude-table=evora.event_batches_p*",
            "--dbname",
            dsn,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return normalise(out)


OBJECTS_HEADER = """\
# Evora's objects in a freshly migrated database, one a line: what `evora migrate --check`
# expects (evora/storage/drift.py). Never edit by hand: generated with schema.sql by
#     python -m tests.schemadump
"""


async def objects(dsn: str) -> str:
    """objects.txt's text for the database at `dsn`."""
    conn = await asyncpg.connect(dsn)
    try:
        found = await drift.schema_objects(conn)
    finally:
        await conn.close()
    return OBJECTS_HEADER + "".join(f"{thing}\n" for thing in sorted(found))


def expected() -> str:
    """What schema.sql holds, normalised the same way (its header is a comment)."""
    return normalise(SCHEMA_FILE.read_text("utf-8"))


async def _migrated(server: LocalPostgres) -> str:
    admin = await asyncpg.connect(server.dsn())
    try:
        await admin.execute("CREATE DATABASE evora_schema TEMPLATE template0")
    finally:
        await admin.close()
    dsn = server.dsn("evora_schema")
    await apply_migrations(dsn)
    return dsn


def main() -> None:
    with (
        tempfile.TemporaryDirectory(prefix="evora-schema-") as tmp,
        LocalPostgres(Path(tmp) / "data", durable=False) as server,
    ):
        dsn = asyncio.run(_migrated(server))
        SCHEMA_FILE.write_text(HEADER + "\n" + dump(dsn), "utf-8")
        OBJECTS_FILE.write_text(asyncio.run(objects(dsn)), "utf-8")
    print(f"wrote {SCHEMA_FILE} and {OBJECTS_FILE}", file=sys.stderr)


if __name__ == "__main__":
    main()
