"""evora.sql_enqueue on the application's own connection, per driver: the job is in the
caller's transaction (gone with its rollback, there with its commit), options and batches go
through, errors are the driver's with the SQLSTATE of the SQL function."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
import psycopg
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from evora import sql_enqueue as sql

RUN_AT = datetime(2030, 1, 1, tzinfo=UTC)
OPTIONS: dict[str, Any] = {
    "priority": 4,
    "run_at": RUN_AT,
    "max_attempts": 2,
    "backoff": {"initial_seconds": 3},
    "idempotency_key": "k-1",
    "group_key": "g",
}


async def _jobs(conn: asyncpg.Connection) -> list[asyncpg.Record]:
    return list(await conn.fetch("SELECT * FROM evora.jobs ORDER BY submit_seq"))


async def _check_stored(app_conn: asyncpg.Connection, job_id: UUID, batch: list[UUID]) -> None:
    rows = await _jobs(app_conn)
    assert [r["id"] for r in rows] == [job_id, *batch]
    first = rows[0]
    assert (first["priority"], first["run_at"], first["max_attempts"]) == (4, RUN_AT, 2)
    assert (first["backoff_initial"], first["idempotency_key"], first["group_key"]) == (
        3,
        "k-1",
        "g",
    )
    assert first["payload"] == '{"to": "a@example.com"}'
    assert [r["type"] for r in rows[1:]] == ["b.1", "b.2"]


BATCH = [
    {"queue": "mail", "type": "b.1", "delay_seconds": 5},
    {"queue": "mail", "type": "b.2", "expires_at": datetime.now(UTC) + timedelta(days=1)},
]


def _sqlalchemy_url(db_url: str, driver: str) -> str:
    return db_url.replace("postgresql://", f"postgresql+{driver}://", 1)


async def test_asyncpg_rollback(db_url: str, app_conn: asyncpg.Connection) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        tx = conn.transaction()
        await tx.start()
        await sql.submit(conn, "mail", "m")
        await sql.submit_batch(conn, BATCH)
        await tx.rollback()
        job_id = await sql.submit(conn, "mail", "m", {"to": "a@example.com"}, **OPTIONS)
        batch = await sql.submit_batch(conn, BATCH)
        # an idempotent replay answers the same id
        assert await sql.submit(conn, "mail", "m", {"to": "a@example.com"}, **OPTIONS) == job_id
        with pytest.raises(asyncpg.InvalidParameterValueError, match=r"^priority: "):
            await sql.submit(conn, "mail", "m", priority=40000)
    finally:
        await conn.close()
    await _check_stored(app_conn, job_id, batch)


async def test_psycopg_async(db_url: str, app_conn: asyncpg.Connection) -> None:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        await sql.submit(conn, "mail", "m")
        await sql.submit_batch(conn, BATCH)
        await conn.rollback()
        async with conn.transaction():
            job_id = await sql.submit(conn, "mail", "m", {"to": "a@example.com"}, **OPTIONS)
            async with conn.cursor() as cursor:
                batch = await sql.submit_batch(cursor, BATCH)
        with pytest.raises(psycopg.errors.UniqueViolation) as raised:
            await sql.submit(conn, "mail", "m", {"to": "b"}, **OPTIONS)
        assert raised.value.diag.constraint_name == "evora_idempotency_conflict"
    await _check_stored(app_conn, job_id, batch)


async def test_psycopg_sync(db_url: str, app_conn: asyncpg.Connection) -> None:
    with psycopg.Connection.connect(db_url) as conn:
        sql.submit_sync(conn, "mail", "m")
        conn.rollback()
        with conn.transaction():
            job_id = sql.submit_sync(conn, "mail", "m", {"to": "a@example.com"}, **OPTIONS)
            batch = sql.submit_batch_sync(conn.cursor(), BATCH)
    await _check_stored(app_conn, job_id, batch)


async def test_sqlalchemy_async(db_url: str, app_conn: asyncpg.Connection) -> None:
    engine = create_async_engine(_sqlalchemy_url(db_url, "asyncpg"))
    try:
        async with engine.connect() as conn:
            await sql.submit(conn, "mail", "m")
            await conn.rollback()
        async with AsyncSession(engine) as session, session.begin():
            job_id = await sql.submit(session, "mail", "m", {"to": "a@example.com"}, **OPTIONS)
            batch = await sql.submit_batch(session, BATCH)
    finally:
        await engine.dispose()
    await _check_stored(app_conn, job_id, batch)


async def test_sqlalchemy_sync(db_url: str, app_conn: asyncpg.Connection) -> None:
    engine = sqlalchemy.create_engine(_sqlalchemy_url(db_url, "psycopg"))
    try:
        with engine.connect() as conn:
            sql.submit_sync(conn, "mail", "m")
            conn.rollback()
        with Session(engine) as session, session.begin():
            job_id = sql.submit_sync(session, "mail", "m", {"to": "a@example.com"}, **OPTIONS)
            batch = sql.submit_batch_sync(session, BATCH)
        with engine.connect() as conn, pytest.raises(sqlalchemy.exc.DataError, match="jobs"):
            sql.submit_batch_sync(conn, [])
    finally:
        engine.dispose()
    await _check_stored(app_conn, job_id, batch)


async def test_the_wrong_flavour_or_object_is_refused(db_url: str) -> None:
    with (
        psycopg.Connection.connect(db_url) as sync_conn,
        pytest.raises(TypeError, match="submit_sync"),
    ):
        await sql.submit(sync_conn, "q", "t")
    conn = await asyncpg.connect(db_url)
    try:
        with pytest.raises(TypeError, match=r"evora\.sql_enqueue\.submit$"):
            sql.submit_sync(conn, "q", "t")
    finally:
        await conn.close()
    with pytest.raises(TypeError, match="asyncpg, psycopg 3 or SQLAlchemy"):
        await sql.submit(object(), "q", "t")


def test_an_unknown_option_is_refused_like_an_unknown_keyword() -> None:
    # the options are typed for a checker, but a caller without one must not lose a typo
    with pytest.raises(TypeError, match="unexpected keyword arguments: prority"):
        sql.submit_sync(object(), "q", "t", prority=1)  # type: ignore[call-arg]


def test_importing_it_loads_no_driver() -> None:
    code = (
        "import sys, evora.sql_enqueue; "
        "print(sorted(m for m in ('asyncpg', 'psycopg', 'sqlalchemy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_its_first_name_still_imports_the_same_functions() -> None:
    # `evora.sql` was the module's name in the docs and in applications
    from evora import sql as first_name

    assert {name: getattr(first_name, name) for name in sql.__all__} == {
        name: getattr(sql, name) for name in sql.__all__
    }
