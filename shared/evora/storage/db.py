"""Connections to PostgreSQL: one place for codecs, timeouts and pool settings."""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson

# A job never holds a transaction while it runs (rule 4); these make a stuck client fail
# fast instead of pinning the outbox horizon and vacuum.
STATEMENT_TIMEOUT_MS = 30_000
IDLE_IN_TRANSACTION_TIMEOUT_MS = 60_000
CONNECT_TIMEOUT_S = 10.0


# The binary form of jsonb is a version byte, then the JSON text.
_JSONB_VERSION = b"\x01"


def _encode_jsonb(value: Any) -> bytes:
    return _JSONB_VERSION + orjson.dumps(value)


def _decode_jsonb(data: bytes) -> Any:
    return orjson.loads(memoryview(data)[1:])


async def _init_connection(conn: asyncpg.Connection) -> None:
    # Binary, because asyncpg decodes a composite value (the job_image row of an event)
    # only when every field type it holds is read in binary.
    await conn.set_type_codec(
        "jsonb",
        encoder=_encode_jsonb,
        decoder=_decode_jsonb,
        schema="pg_catalog",
        format="binary",
    )
    await conn.set_type_codec(
        "json", encoder=orjson.dumps, decoder=orjson.loads, schema="pg_catalog", format="binary"
    )


async def _reset(conn: asyncpg.Connection) -> None:
    # Pool connections never LISTEN, lock or SET anything, so asyncpg's default reset
    # (four statements, an extra round trip per acquire) would be pure overhead on the hot
    # path; only an abandoned transaction needs undoing.
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


def _server_settings(application_name: str, statement_timeout: int | None) -> dict[str, str]:
    settings = {
        "application_name": application_name,
        "idle_in_transaction_session_timeout": str(IDLE_IN_TRANSACTION_TIMEOUT_MS),
    }
    if statement_timeout is not None:
        settings["statement_timeout"] = str(statement_timeout)
    return settings


async def connect(
    dsn: str,
    *,
    application_name: str = "evora",
    statement_timeout: int | None = STATEMENT_TIMEOUT_MS,
) -> asyncpg.Connection:
    """A standalone connection (migrations, LISTEN, advisory-lock holders)."""
    conn: asyncpg.Connection = await asyncpg.connect(
        dsn,
        timeout=CONNECT_TIMEOUT_S,
        server_settings=_server_settings(application_name, statement_timeout),
    )
    await _init_connection(conn)
    return conn


async def create_pool(
    dsn: str,
    *,
    application_name: str = "evora",
    min_size: int = 2,
    max_size: int = 10,
) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        timeout=CONNECT_TIMEOUT_S,
        init=_init_connection,
        reset=_reset,
        server_settings=_server_settings(application_name, STATEMENT_TIMEOUT_MS),
    )
    assert pool is not None
    return pool
