"""`evora migrate` while another session holds a transaction open: the index builds it runs
CONCURRENTLY after the migrations wait for that transaction, give up and are left to the next
run (the upgrade tests of migrations 0066 and 0068)."""

from __future__ import annotations

import logging

import asyncpg
import pytest
from asyncpg.transaction import Transaction

from evora.storage.migrate import apply_migrations


async def migrate_past_an_open_transaction(
    url: str, holder: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> tuple[list[int], Transaction]:
    """Migrate the database at `url` while `holder` holds a transaction that took an xid; the
    versions applied, and that transaction, still open (the caller ends it). Asserts that the
    run warned of the builds it left."""
    held = holder.transaction()
    await held.start()
    await holder.fetchval("SELECT txid_current()")
    with caplog.at_level(logging.WARNING, logger="evora.storage.migrate"):
        applied = await apply_migrations(url, index_build_retry_for_s=1.0)
    assert "run `evora migrate` again" in caplog.text
    return applied, held
