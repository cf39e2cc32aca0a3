"""Versioned SQL migrations and the function files, applied under an advisory lock.

Migrations are `migrations/NNNN_name.sql`, applied in order, each in its own transaction and
recorded with a checksum in `evora_migrations`. A second run is a no-op; concurrent runs
serialise on the lock and the later ones find nothing to do. Editing an applied file is
refused (its checksum no longer matches), because the database would silently differ from
what the file says.

A file may begin with statements that must be committed before the rest can use them
(`ALTER TYPE ... ADD VALUE`), ended by a line `-- evora:commit`: they run first, outside the
file's transaction, so they must be re-runnable (IF NOT EXISTS).

Migrations keep tables, indexes and data. Every database function and trigger has its current
text in one of `functions/<area>.sql` (CREATE OR REPLACE, so a file can run again): after the
migrations, every file whose checksum differs from the one recorded in `evora_function_files`
(every file, when migrations were applied) runs again, all of them in one transaction, in
name order. The functions that old migrations
defined stay in them as history; the files supersede them. A database the migrations alone
brought up to date (an installation from before the files existed) is thus brought to the
files' text by its next `evora migrate`. A partial run (`upto`) builds a historical schema
and leaves the files alone: they describe the newest one.
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

_CREATE_FILES_TABLE = """
CREATE TABLE IF NOT EXISTS evora_function_files (
    name       text        PRIMARY KEY,
    checksum   text        NOT NULL,
    migration  integer     NOT NULL,
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


@dataclass(frozen=True)
class FunctionFile:
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def function_files() -> list[FunctionFile]:
    """The files holding the current text of every function and trigger, in the order they
    are applied (by name)."""
    found = [
        FunctionFile(entry.name.removesuffix(".sql"), entry.read_text(encoding="utf-8"))
        for entry in resources.files("evora.storage.functions").iterdir()
        if entry.name.endswith(".sql")
    ]
    return sorted(found, key=lambda f: f.name)


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


async def applied_function_files(conn: asyncpg.Connection) -> dict[str, tuple[str, int]]:
    """Each recorded function file's checksum and the newest migration of the code that
    applied it."""
    exists = await conn.fetchval("SELECT to_regclass('evora_function_files') IS NOT NULL")
    if not exists:
        return {}
    rows = await conn.fetch("SELECT name, checksum, migration FROM evora_function_files")
    return {row["name"]: (row["checksum"], row["migration"]) for row in rows}


async def stale_function_files(conn: asyncpg.Connection) -> list[str]:
    """Function files this code needs that the database lacks: never applied, or applied by
    code that knew fewer migrations and differs. A different checksum recorded by code at the
    same or a newer migration is taken for a newer release (as with migrations, a database
    ahead still serves this code), so a rolling upgrade does not turn old replicas unready."""
    applied = await applied_function_files(conn)
    latest = latest_version()
    stale = []
    for file in function_files():
        recorded = applied.get(file.name)
        if recorded is None or (recorded[0] != file.checksum and recorded[1] < latest):
            stale.append(file.name)
    return stale


async def apply_migrations(
    dsn: str, *, upto: int | None = None, pooler: Pooler = "none"
) -> list[int]:
    """Bring the database at `dsn` (behind `pooler`) up to date, the function files included
    (or up to version `upto`, without them); return the migration versions this call
    applied."""
    if pooler == "transaction":
        # The lock below is the session's: behind a transaction-mode pooler it would stay on
        # whichever server connection took it (and the unlock run on another), so two
        # migrators could both run, or every later one wait forever.
        raise MigrationError(
            "migrations need a session of their own: set EVORA_DIRECT_DATABASE_URL to "
            "PostgreSQL itself (or a session-mode pool)"
        )
    conn = await connect(dsn, statement_timeout=None, pooler=pooler)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", locks.MIGRATIONS)
        try:
            applied = await _apply_pending(conn, upto)
            if upto is None:
                await _apply_function_files(conn, after_migrations=bool(applied))
            return applied
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


async def _apply_function_files(conn: asyncpg.Connection, *, after_migrations: bool) -> None:
    """Run every function file whose checksum differs from the recorded one, or every file
    when this run applied migrations, all in one transaction; but not over the text a release
    that knew more migrations applied (an older release's `evora migrate`, run again during a
    rolling upgrade, must not take the database back).

    The files are the truth about functions: a migration that (re)defines or drops one (an
    old one, on a fresh database; a signature change) is followed by every file, so a fresh
    database and an upgraded one end with the same text."""
    await conn.execute(_CREATE_FILES_TABLE)
    recorded = await applied_function_files(conn)
    latest = latest_version()
    changed: list[FunctionFile] = []
    newer: list[FunctionFile] = []
    for file in function_files():
        checksum, migration = recorded.get(file.name, ("", 0))
        if migration > latest and checksum != file.checksum:
            newer.append(file)
        elif after_migrations or checksum != file.checksum:
            changed.append(file)
    if newer:
        log.warning(
            "function files %s were applied by a newer release; left as they are",
            [f.name for f in newer],
        )
    if changed:
        async with conn.transaction():
            for file in changed:
                await conn.execute(file.sql)
                await conn.execute(
                    """
                    INSERT INTO evora_function_files (name, checksum, migration)
                    VALUES ($1, $2, $3)
                    ON CONFLICT (name) DO UPDATE
                    SET checksum = excluded.checksum, migration = excluded.migration,
                        applied_at = now()
                    """,
                    file.name,
                    file.checksum,
                    latest,
                )
        log.info("applied function files: %s", ", ".join(f.name for f in changed))
