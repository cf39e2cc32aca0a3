"""A database filled once for a whole test module, and a copy of it for each test.

The plan tests count what a statement reads from a large table, and filling that table was most
of each test's time. A copy of a filled database (CREATE DATABASE ... TEMPLATE, a copy of its
files) holds what the fill left, the planner's statistics (pg_statistic, pg_class) and the
layout of every page included, so each test still starts from the same state, alone."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg

from tests.conftest import _with_database
from tests.databases import create_database

Fill = Callable[[str], Awaitable[None]]


@contextlib.asynccontextmanager
async def filled_database(admin_dsn: str, template: str, fill: Fill) -> AsyncIterator[str]:
    """The name of a database made from `template` and filled by `fill` (given its DSN), to be
    copied and never connected to. It is itself a copy of the database `fill` wrote: the
    server's cumulative statistics are not copied, so its tables (and each copy's) carry no
    count of the fill's rows, and autovacuum, which acts on those counts, leaves them as the
    fill left them, not vacuumed or analyzed again between one test's copy and the next."""
    filling, filled = f"filling_{uuid.uuid4().hex}", f"filled_{uuid.uuid4().hex}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await create_database(admin, filling, template)
        try:
            await fill(_with_database(admin_dsn, filling))
            await create_database(admin, filled, filling)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{filling}" WITH (FORCE)')
        try:
            yield filled
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{filled}" WITH (FORCE)')
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def copy_of(admin_dsn: str, source: str) -> AsyncIterator[str]:
    """The DSN of a copy of database `source`, dropped afterwards. Settings made by ALTER
    DATABASE are not copied."""
    name = f"test_{uuid.uuid4().hex}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await create_database(admin, name, source)
        try:
            yield _with_database(admin_dsn, name)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()
