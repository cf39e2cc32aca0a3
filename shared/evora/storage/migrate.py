"""Versioned SQL migrations, applied under an advisory lock.

Files are `migrations/NNNN_name.sql`, applied in order, each in its own transaction and
recorded with a checksum in `evora_migrations`. A second run is a no-op; concurrent runs
serialise on the lock and the later ones find nothing to do. Editing an applied file is
refused (its checksum no longer matches), because the database would silently differ from
what the file says.

A file may begin with statements that must be committed before the rest can use them
(`ALTER TYPE ... ADD VALUE`), ended by a line `-- evora:commit`: they run first, outside the
file's transaction, so they must be re-runnable (IF NOT EXISTS).
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources

import asyncpg

from evora.storage import locks
from evora.storage.db import Pooler, connect

log = logging.getLogger(__name__)


_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_COMMIT_MARKER = "\n-- evora:commit\n"

_CREATE_TABLE = """
CREATE TABLE IF NOT EXISTS evora_migrations (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


class MigrationError(Exception):
    """The database's migration history does not match the migration files."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def committed_first(self) -> str | None:
        """The statements to commit before the transaction of the rest, if any."""
        head, marker, _ = self.sql.partition(_COMMIT_MARKER)
        return head if marker else None

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def available() -> list[Migration]:
    found = []
    for entry in resources.files("evora.storage.migrations").iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions in {versions}")
    return found


def latest_version() -> int:
    return available()[-1].version


async def applied_versions(conn: asyncpg.Connection) -> dict[int, str]:
    exists = await conn.fetchval("SELECT to_regclass('evora_migrations') IS NOT NULL")
    if not exists:
        return {}
    rows = await conn.fetch("SELECT version, checksum FROM evora_migrations")
    return {row["version"]: row["checksum"] for row in rows}


async def current_version(conn: asyncpg.Connection) -> int:
    versions = await applied_versions(conn)
    return max(versions, default=0)


async def missing_versions(conn: asyncpg.Connection) -> list[int]:
    """Migrations this code needs that the database has not applied. A database that is
    ahead (a newer release migrated it) still serves this code: migrations only add."""
    applied = await applied_versions(conn)
    return [m.version for m in available() if m.version not in applied]


async def apply_migrations(
    dsn: str, *, upto: int | None = None, pooler: Pooler = "none"
) -> list[int]:
    """Bring the database at `dsn` (behind `pooler`) up to date (or up to version `upto`);
    return the versions this call applied."""
    if pooler == "transaction":
        # The lock below is the session's: behind a transaction-mode pooler it would stay on
        # whichever server connection took it (and the unlock run on another), so two
        # migrators could both run, or every later one wait forever.
        raise MigrationError(
            "migrations need a session of their own: run `evora migrate` with "
            "EVORA_DATABASE_URL naming PostgreSQL directly (or a session-mode pool) and "
            "EVORA_DATABASE_POOLER unset or session"
        )
    conn = await connect(dsn, statement_timeout=None, pooler=pooler)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", locks.MIGRATIONS)
        try:
            return await _apply_pending(conn, upto)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", locks.MIGRATIONS)
    finally:
        await conn.close()


async def _apply_pending(conn: asyncpg.Connection, upto: int | None) -> list[int]:
    await conn.execute(_CREATE_TABLE)
    done = await applied_versions(conn)
    applied: list[int] = []
    for migration in available():
        if upto is not None and migration.version > upto:
            break
        recorded = done.get(migration.version)
        if recorded is not None:
            if recorded != migration.checksum:
                raise MigrationError(
                    f"migration {migration.version:04d}_{migration.name} was changed after it "
                    "was applied; add a new migration instead"
                )
            continue
        if migration.committed_first is not None:
            await conn.execute(migration.committed_first)
        async with conn.transaction():
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO evora_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                migration.version,
                migration.name,
                migration.checksum,
            )
        log.info("applied migration %04d_%s", migration.version, migration.name)
        applied.append(migration.version)
    unknown = sorted(set(done) - {m.version for m in available()})
    if unknown:
        log.warning("database has migrations this code does not know: %s", unknown)
    return applied
