"""What `evora doctor` reads from PostgreSQL; the statements are in sql/doctor.sql."""

from __future__ import annotations

import time
from dataclasses import dataclass

import asyncpg

from evora.storage.statements import load

(
    OLDEST_XMIN_HOLDER,
    DEAD_TUPLES,
    OUTBOX_BACKLOG,
    ADVISORY_LOCK_HELD,
    DATABASE_CLOCK,
    SETTINGS_DIFFERING,
) = load(
    "doctor",
    "oldest_xmin_holder",
    "dead_tuples",
    "outbox_backlog",
    "advisory_lock_held",
    "database_clock",
    "settings_differing",
)


@dataclass(frozen=True)
class XminHolder:
    pid: int
    application: str
    state: str | None
    seconds: float


@dataclass(frozen=True)
class DeadTuples:
    table: str
    dead: int
    live: int


@dataclass(frozen=True)
class Backlog:
    events: int
    oldest_seconds: float | None
    progress_seconds: float | None


async def server_major(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SHOW server_version_num")) // 10_000


async def oldest_xmin_holder(conn: asyncpg.Connection) -> XminHolder | None:
    row = await conn.fetchrow(OLDEST_XMIN_HOLDER)
    return None if row is None else XminHolder(**dict(row))


async def dead_tuples(conn: asyncpg.Connection) -> list[DeadTuples]:
    return [
        DeadTuples(r["table_name"], r["dead"], r["live"]) for r in await conn.fetch(DEAD_TUPLES)
    ]


async def outbox_backlog(conn: asyncpg.Connection, cap: int) -> Backlog:
    row = await conn.fetchrow(OUTBOX_BACKLOG, cap)
    return Backlog(row["events"], row["oldest_seconds"], row["progress_seconds"])


async def lock_held(conn: asyncpg.Connection, key: int) -> bool:
    return bool(await conn.fetchval(ADVISORY_LOCK_HELD, key))


async def clock_skew(conn: asyncpg.Connection) -> float:
    """The database's clock minus this host's, seconds: the host's reading is taken half-way
    through the round trip."""
    before = time.time()
    database: float = await conn.fetchval(DATABASE_CLOCK)
    after = time.time()
    return database - (before + after) / 2


async def settings_differing(conn: asyncpg.Connection, wanted: dict[str, str]) -> list[str]:
    """The names of `wanted`'s settings (values in pg_settings' base units) that this
    session has otherwise."""
    names: list[str] = await conn.fetchval(SETTINGS_DIFFERING, list(wanted), list(wanted.values()))
    return names
