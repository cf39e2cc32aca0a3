"""Versioned SQL migrations and the function files, applied under an advisory lock.

Migrations are `migrations/NNNN_name.sql`, applied in order and recorded with a checksum
in `evora.migrations`; the pending ones and the function files run in one transaction (split
only where a commit marker needs it), so the previous release's services, serving meanwhile,
see the schema before the upgrade or after it, never half of it. A second run is a no-op;
concurrent runs serialise on the lock and the later ones find nothing to do. Editing an
applied file is refused (its checksum no longer matches), because the database would
silently differ from what the file says.

A file may begin with statements that must be committed before the rest can use them
(`ALTER TYPE ... ADD VALUE`), ended by a line `-- evora:commit`: they run first, outside the
file's transaction, so they must be re-runnable (IF NOT EXISTS).

Migrations keep tables, indexes and data. Every database function and trigger has its current
text in one of `functions/<area>.sql` (CREATE OR REPLACE, so a file can run again): after the
migrations, in their transaction, every file whose checksum differs from the one recorded in
`evora.function_files` (every file, when migrations were applied) runs again, in name order.
The functions that old migrations defined stay in them as history; the files supersede
them. A database the migrations alone brought up to date (an installation from before the
files existed) is thus brought to the files' text by its next `evora migrate`. A partial
run (`upto`) builds a historical schema and leaves the files alone: they describe the
newest one.

An index added to a partitioned table is made ON ONLY the table by its migration, which
builds it at once on the small partitions only; `evora migrate` then builds it on the others
CONCURRENTLY, after the migrations' transactions, and drops the index it replaced once it is
valid (`build_partition_indexes`): a plain build would stop the writers of a large partition
for as long as it took. An index added to a large plain table is left to the same step by
its migration (a row in `evora.index_builds`).

Every statement runs under a short `lock_timeout`: a lock request queued behind a long
transaction would queue every later statement on that table behind itself (the claims and
submissions of a live queue), for as long as that transaction lasts. A transaction that cannot
get its locks in time is rolled back and tried again after a growing pause, until
`LOCK_RETRY_FOR_S` has passed.

The two records lived in the deployment's own schema, as `evora_migrations` and
`evora_function_files`, until migration 0030 moved them into `evora` with everything else:
they are read where they are, and a database migrated for the first time is given them in
`evora` directly, unless the run stops before 0030 (a historical schema, as the tests build:
then where that release kept them).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from importlib import resources

import asyncpg

from evora.storage import locks
from evora.storage.db import Pooler, connect
from evora.storage.retention import (
    EVENT_PARTITION_SECONDS,
    EVENT_PARTITIONS_AHEAD,
    MAKE_EVENT_PARTITIONS,
)
from evora.storage.statements import load, with_rules

log = logging.getLogger(__name__)

(
    PARTITION_INDEXES_MISSING,
    INDEX_BUILDS,
    FORGET_INDEX_BUILD,
    INDEX_STATE,
    PARTITION_ATTACHED,
    RETIRING_INDEXES_READY,
    RETIRING_INDEXES,
    FORGET_RETIRING_INDEX,
) = load(
    "partition_indexes",
    "partition_indexes_missing",
    "index_builds",
    "forget_index_build",
    "index_state",
    "partition_attached",
    "retiring_indexes_ready",
    "retiring_indexes",
    "forget_retiring_index",
)


_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

_COMMIT_MARKER = "\n-- evora:commit\n"

# How long one statement may wait for a lock before its transaction steps aside: the longest
# a query of the live queue waits behind a migration's lock request.
LOCK_TIMEOUT_MS = 2_000
# Pauses between attempts: doubling from the first to the last, for at most this long in all.
_RETRY_FIRST_S = 0.1
_RETRY_LAST_S = 5.0
LOCK_RETRY_FOR_S = 600.0
# How long the builds after the migrations (build_partition_indexes) keep trying to get past
# the transactions a CONCURRENTLY build waits for, before `evora migrate` leaves them to its
# next run: the schema is committed by then and correct without them.
INDEX_BUILD_RETRY_FOR_S = 120.0

# The migration that moves Evora's objects, the records included, into the schema `evora`.
NAMESPACE_VERSION = 30

# The records: where they are now, and where a release before NAMESPACE_VERSION kept them.
_MIGRATIONS = ("evora.migrations", "evora_migrations")
_FUNCTION_FILES = ("evora.function_files", "evora_function_files")

_CREATE_TABLE = """
CREATE TABLE {table} (
    version    integer PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""

_CREATE_FILES_TABLE = """
CREATE TABLE IF NOT EXISTS evora.function_files (
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
        FunctionFile(entry.name.removesuffix(".sql"), with_rules(entry.read_text(encoding="utf-8")))
        for entry in resources.files("evora.storage.functions").iterdir()
        if entry.name.endswith(".sql")
    ]
    return sorted(found, key=lambda f: f.name)


def latest_version() -> int:
    return available()[-1].version


async def _record(conn: asyncpg.Connection, names: tuple[str, str]) -> str | None:
    """The table of a record (`_MIGRATIONS`, `_FUNCTION_FILES`), qualified as the catalog
    prints it, wherever the database keeps it; None if it has none."""
    found: str | None = await conn.fetchval(
        "SELECT coalesce(to_regclass($1), to_regclass($2))::text", *names
    )
    return found


async def applied_versions(conn: asyncpg.Connection) -> dict[int, str]:
    table = await _record(conn, _MIGRATIONS)
    if table is None:
        return {}
    rows = await conn.fetch(f"SELECT version, checksum FROM {table}")
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
    table = await _record(conn, _FUNCTION_FILES)
    if table is None:
        return {}
    rows = await conn.fetch(f"SELECT name, checksum, migration FROM {table}")
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
    dsn: str,
    *,
    upto: int | None = None,
    pooler: Pooler = "none",
    event_partition_seconds: int = EVENT_PARTITION_SECONDS,
    event_partitions_ahead: int = EVENT_PARTITIONS_AHEAD,
    index_build_retry_for_s: float = INDEX_BUILD_RETRY_FOR_S,
) -> list[int]:
    """Bring the database at `dsn` (behind `pooler`) up to date, the function files included,
    job_events' partitions made ahead as the sweeper makes them and the indexes a migration
    left to build on large partitions (or up to version `upto`, without any of those);
    return the migration versions this call applied."""
    if pooler == "transaction":
        # The lock below is the session's: behind a transaction-mode pooler it would stay on
        # whichever server connection took it (and the unlock run on another), so two
        # migrators could both run, or every later one wait forever.
        raise MigrationError(
            "migrations need a session of their own: set EVORA_DIRECT_DATABASE_URL to "
            "PostgreSQL itself (or a session-mode pool)"
        )
    partitions = (event_partition_seconds, event_partitions_ahead)
    conn = await connect(dsn, statement_timeout=None, pooler=pooler)
    try:
        # Waits for another migrator as long as it takes (it holds no lock a query needs),
        # so the lock_timeout comes after it.
        await conn.execute("SELECT pg_advisory_lock($1)", locks.MIGRATIONS)
        try:
            await conn.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
            await _create_migrations_table(conn, upto)
            groups = _groups(await _pending(conn, upto))
            for n, group in enumerate(groups):
                what = f"migrations {', '.join(f'{m.version:04d}' for m in group)}"
                head = group[0].committed_first
                if head is not None:
                    await _retrying_locks(what, partial(conn.execute, head))
                files = upto is None and n == len(groups) - 1
                await _retrying_locks(
                    what, partial(_apply, conn, group, files=files, partitions=partitions)
                )
            if not groups and upto is None:
                await _retrying_locks(
                    "the function files",
                    partial(_apply, conn, [], files=True, partitions=partitions),
                )
            if upto is None:
                await build_partition_indexes(conn, retry_for_s=index_build_retry_for_s)
            return [m.version for group in groups for m in group]
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", locks.MIGRATIONS)
    finally:
        await conn.close()


async def _create_migrations_table(conn: asyncpg.Connection, upto: int | None) -> None:
    """Make the record of migrations on a database that has none: in `evora`, or where the
    releases before NAMESPACE_VERSION kept it when this run builds one of their schemas."""
    if await _record(conn, _MIGRATIONS) is not None:
        return
    if upto is not None and upto < NAMESPACE_VERSION:
        await conn.execute(_CREATE_TABLE.format(table=_MIGRATIONS[1]))
    else:
        await conn.execute("CREATE SCHEMA IF NOT EXISTS evora")
        await conn.execute(_CREATE_TABLE.format(table=_MIGRATIONS[0]))


async def _pending(conn: asyncpg.Connection, upto: int | None) -> list[Migration]:
    """The migrations (up to `upto`) the database lacks; refuses an applied one edited since."""
    done = await applied_versions(conn)
    pending: list[Migration] = []
    for migration in available():
        if upto is not None and migration.version > upto:
            break
        recorded = done.get(migration.version)
        if recorded is None:
            pending.append(migration)
        elif recorded != migration.checksum:
            raise MigrationError(
                f"migration {migration.version:04d}_{migration.name} was changed after it "
                "was applied; add a new migration instead"
            )
    unknown = sorted(set(done) - {m.version for m in available()})
    if unknown:
        log.warning("database has migrations this code does not know: %s", unknown)
    return pending


def _groups(pending: list[Migration]) -> list[list[Migration]]:
    """The pending migrations in the transactions they run in: as few as the commit markers
    allow, since the services of the previous release keep serving meanwhile and must see
    the schema either before the upgrade or after it, never in between (a migration that
    replaces a function its statements call, with the files restoring what they need, is
    only safe in one transaction with them)."""
    groups: list[list[Migration]] = []
    for migration in pending:
        if not groups or migration.committed_first is not None:
            groups.append([])
        groups[-1].append(migration)
    return groups


async def _apply(
    conn: asyncpg.Connection,
    group: list[Migration],
    *,
    files: bool,
    partitions: tuple[int, int] = (EVENT_PARTITION_SECONDS, EVENT_PARTITIONS_AHEAD),
) -> None:
    """The migrations of `group`, then (`files`) the function files and job_events'
    partitions made ahead (`partitions`: width in seconds, how many), in one transaction:
    migration 0032's first partition ends a minute after it starts."""
    async with conn.transaction():
        for migration in group:
            await conn.execute(migration.sql)
            # Looked up after each migration: NAMESPACE_VERSION moves it.
            table = await _record(conn, _MIGRATIONS)
            await conn.execute(
                f"INSERT INTO {table} (version, name, checksum) VALUES ($1, $2, $3)",
                migration.version,
                migration.name,
                migration.checksum,
            )
        if files:
            await _apply_function_files(conn, after_migrations=bool(group))
            await conn.execute(MAKE_EVENT_PARTITIONS, *partitions)
    for migration in group:
        log.info("applied migration %04d_%s", migration.version, migration.name)


async def _apply_function_files(conn: asyncpg.Connection, *, after_migrations: bool) -> None:
    """Run every function file whose checksum differs from the recorded one, or every file
    when this run applied migrations (in the caller's transaction); but not over the text a
    release that knew more migrations applied (an older release's `evora migrate`, run again
    during a rolling upgrade, must not take the database back).

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
    for file in changed:
        await conn.execute(file.sql)
        await conn.execute(
            """
            INSERT INTO evora.function_files (name, checksum, migration)
            VALUES ($1, $2, $3)
            ON CONFLICT (name) DO UPDATE
            SET checksum = excluded.checksum, migration = excluded.migration,
                applied_at = now()
            """,
            file.name,
            file.checksum,
            latest,
        )
    if changed:
        log.info("applied function files: %s", ", ".join(f.name for f in changed))


async def build_partition_indexes(
    conn: asyncpg.Connection, *, retry_for_s: float = INDEX_BUILD_RETRY_FOR_S
) -> None:
    """Build, CONCURRENTLY and one at a time, the indexes that partitions of Evora's tables
    lack of their table's partitioned indexes (each then attached) and those of plain tables a
    migration left to build (evora.index_builds); then drop the indexes a migration replaced
    whose replacement is now valid (evora.retiring_indexes). A build that cannot get past the
    transactions it waits for (open since before it, in this database) within `retry_for_s`
    is left, with a warning, to the next `evora migrate`.

    A migration that adds an index to a partitioned table makes it ON ONLY the table and
    builds it at once on the small partitions (migration 0066); one that adds an index to a
    large plain table leaves it here (migration 0068): a plain build stops every write of the
    table (the outbox's inserts, the jobs' transitions) for as long as it takes. A
    CONCURRENTLY build lets the writers go on, and cannot run in a transaction, hence here,
    after the migrations' transactions."""
    builds = [
        (row, partial(_build_and_attach, conn, row, wait_s=retry_for_s))
        for row in await conn.fetch(PARTITION_INDEXES_MISSING)
    ] + [
        (row, partial(_build_left, conn, row, wait_s=retry_for_s))
        for row in await conn.fetch(INDEX_BUILDS)
    ]
    for row, build in builds:
        child = row["child"]
        log.info("building index %s (CONCURRENTLY)", child)
        started = time.monotonic()
        try:
            await _retrying_locks(f"index {child}", build, for_s=retry_for_s)
        except MigrationError as error:
            log.warning(
                "%s; the schema is migrated, and reads what the index is not built for yet "
                "through the indexes it replaces: run `evora migrate` again",
                error,
            )
            return
        except asyncpg.UndefinedTableError:
            log.info("%s: its partition was removed meanwhile", child)
            continue
        log.info("built index %s in %.1f s", child, time.monotonic() - started)
    for row in await conn.fetch(RETIRING_INDEXES_READY):
        try:
            await _retrying_locks(
                f"dropping index {row['name']}",
                partial(_retire, conn, row["name"], row["drop"]),
                for_s=retry_for_s,
            )
        except MigrationError as error:
            log.warning("%s; run `evora migrate` again", error)
            return
        log.info("dropped index evora.%s, replaced", row["name"])


async def unfinished_index_builds(conn: asyncpg.Connection) -> list[str]:
    """What build_partition_indexes() has left to do, by name: each index to build, each
    replaced index to drop (`evora doctor` warns of them). For a database with every
    migration applied."""
    left = [row["child"] for row in await conn.fetch(PARTITION_INDEXES_MISSING)]
    left += [row["child"] for row in await conn.fetch(INDEX_BUILDS)]
    return left + [
        f"{row['name']} (to drop, replaced)" for row in await conn.fetch(RETIRING_INDEXES)
    ]


async def _build(conn: asyncpg.Connection, index: asyncpg.Record, *, wait_s: float) -> None:
    """An index built CONCURRENTLY, unless a run before this one built it, and built again if
    that run was interrupted and left it invalid.

    The build waits up to `wait_s` at once for the transactions it must outlast, not the
    session's short lock timeout: its waits hold no lock a writer needs (it takes SHARE
    UPDATE EXCLUSIVE on the table, which writes do not conflict with), and a build timed
    out in its last phase has built the whole index for nothing, again at each retry."""
    valid = await conn.fetchval(INDEX_STATE, index["child"])
    if valid is False:
        await conn.execute(index["drop_leftover"])
    if valid is not True:
        await conn.execute(f"SET lock_timeout = {round(wait_s * 1000)}")
        try:
            await conn.execute(index["build"])
        finally:
            await conn.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")


async def _build_left(conn: asyncpg.Connection, index: asyncpg.Record, *, wait_s: float) -> None:
    """A plain table's index a migration left to build (evora.index_builds), then forgotten."""
    await _build(conn, index, wait_s=wait_s)
    await conn.execute(FORGET_INDEX_BUILD, index["name"])


async def _build_and_attach(
    conn: asyncpg.Connection, index: asyncpg.Record, *, wait_s: float
) -> None:
    """One partition's index, built (_build) and attached. A partition that retention
    detached meanwhile (the oldest, the first built) keeps its index unattached and leaves
    with it."""
    await _build(conn, index, wait_s=wait_s)
    try:
        await conn.execute(index["attach"])
    except asyncpg.PostgresError:
        if await conn.fetchval(PARTITION_ATTACHED, index["partition"]):
            raise
        log.info("%s: its table is no partition any more (retention)", index["child"])


async def _retire(conn: asyncpg.Connection, name: str, drop: str | None) -> None:
    async with conn.transaction():
        if drop is not None:
            await conn.execute(drop)
        await conn.execute(FORGET_RETIRING_INDEX, name)


async def _retrying_locks(
    what: str, attempt: Callable[[], Awaitable[object]], *, for_s: float = LOCK_RETRY_FOR_S
) -> None:
    """Run `attempt` (a transaction, or statements that can run again) until it gets its
    locks within the session's lock_timeout without a deadlock, pausing longer after each
    refusal, for at most `for_s` seconds."""
    give_up = time.monotonic() + for_s
    pause = _RETRY_FIRST_S
    while True:
        try:
            await attempt()
            return
        except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError) as error:
            # A deadlock rolled the attempt back as a lock timeout does: try it again.
            if time.monotonic() + pause > give_up:
                raise MigrationError(
                    f"{what} could not get its locks for {for_s:.0f} s: a long "
                    "transaction holds them (see pg_stat_activity); try again after it"
                ) from error
            log.warning("%s waits for a lock (%s); trying again in %.1f s", what, error, pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, _RETRY_LAST_S)
