"""Making the tests' databases. Every test gets a database of its own, so a suite run makes
about 1,500 of them: how PostgreSQL copies the template is a large share of its time."""

from __future__ import annotations

import asyncpg


async def create_database(
    admin: asyncpg.Connection, name: str, template: str | None = None
) -> None:
    """CREATE DATABASE `name` from `template` (the server's default, template1, if None) by
    copying its files. PostgreSQL 15 made WAL_LOG the default strategy, which writes every
    page of the template through the buffer cache and the log: with the test server's data
    in memory (tests/scratch.py) a clone of Evora's migrated template (~10 MB) took 32-36 ms
    that way, 20-27 ms by FILE_COPY, whose two checkpoints cost little with fsync off. 14
    knows only the file copy."""
    clone = f' TEMPLATE "{template}"' if template else ""
    if admin.get_server_version().major >= 15:
        clone += " STRATEGY FILE_COPY"
    await admin.execute(f'CREATE DATABASE "{name}"{clone}')
