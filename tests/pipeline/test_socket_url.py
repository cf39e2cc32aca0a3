"""`evora pipeline` with a database URL that names a Unix socket (`?host=/dir`, what many
local and managed setups give): JDBC reaches it through junixsocket's socket factory, and a
URL it cannot use fails in one line before Spark starts."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from urllib.parse import quote

import asyncpg
import pytest
from pyspark.sql import SparkSession

from evora_services.pipeline.jdbc import UNIX_SOCKET_JAR, JdbcSource, unix_socket
from tests.cli.commands import evora, one_line


def test_the_socket_file_is_found_as_libpq_finds_it() -> None:
    assert unix_socket("postgresql://u@/evora?host=/run/pg&port=5433") == "/run/pg/.s.PGSQL.5433"
    assert unix_socket(f"postgresql://u@{quote('/run/pg', safe='')}/evora") == (
        "/run/pg/.s.PGSQL.5432"
    )
    assert unix_socket("postgresql://u@db.example:5433/evora?sslmode=require") is None


JUNIXSOCKET = os.path.isfile(UNIX_SOCKET_JAR)


@pytest.mark.skipif(not JUNIXSOCKET, reason=f"no junixsocket at {UNIX_SOCKET_JAR} (test.sh has)")
async def test_events_are_read_through_the_socket(spark: SparkSession, db_url: str) -> None:
    connection = await asyncpg.connect(db_url)
    try:
        directory = (await connection.fetchval("SHOW unix_socket_directories")).split(",")[0]
        port = await connection.fetchval("SHOW port")
        database = await connection.fetchval("SELECT current_database()")
        user = await connection.fetchval("SELECT current_user")
    finally:
        await connection.close()
    if not directory:
        pytest.skip("this PostgreSQL listens on no Unix socket")
    dsn = f"postgresql://{user}@/{database}?host={directory}&port={port}"
    source = JdbcSource.from_dsn(dsn, partitions=2)
    queries = [f"SELECT g AS seq FROM generate_series({lo}, {lo + 24}) g" for lo in (1, 26)]
    rows = await asyncio.to_thread(lambda: source.read(spark, queries).count())
    assert rows == 50


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "postgresql://u@/evora?host=/no/such/dir",
            "EVORA_DATABASE_URL names a Unix socket that does not exist "
            "(/no/such/dir/.s.PGSQL.5432)",
        ),
        (
            "postgresql://u@/evora?host=/a,/b",
            "EVORA_DATABASE_URL: the database URL names several socket directories (/a,/b)",
        ),
    ],
)
def test_a_url_jdbc_cannot_use_fails_in_one_line_before_spark(
    url: str, message: str, tmp_path: Path
) -> None:
    result = evora("pipeline", "run", "--no-mongo", env={"EVORA_DATABASE_URL": url}, cwd=tmp_path)
    assert result.returncode == 2
    assert message in one_line(result.stderr)
