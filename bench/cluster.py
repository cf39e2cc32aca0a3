"""The servers every system shares: one durable PostgreSQL (fsync, synchronous_commit and
full_page_writes on: the embedded server's defaults) and the MongoDB-wire stand-in that
Evora's projector writes its read models to. Each system gets its own database."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Self

import asyncpg

from bench import pgperf, procstats
from evora.embedded import LocalMongo, LocalPostgres

SETTINGS_SHOWN = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_level",
    "shared_buffers",
    "max_wal_size",
    "max_connections",
    "autovacuum",
    "shared_preload_libraries",
)


class Cluster:
    def __init__(
        self,
        directory: Path,
        *,
        statements: bool = False,
        bin_dir: Path | None = None,
        perf: bool = False,
    ) -> None:
        self.postgres = LocalPostgres(directory / "pgdata", durable=True, bin_dir=bin_dir)
        self.mongo = LocalMongo(directory / "mongo", log_path=directory / "mongo.log")
        # `perf`: each drain is recorded (bench.pgperf), and pg_stat_statements counts the
        # statements inside functions too, with the functions' own times
        self.statements = statements or perf
        self.nested = perf
        self.directory = directory
        self.perf: pgperf.PgPerf | None = None

    def __enter__(self) -> Self:
        self.postgres.start()
        try:
            if self.statements:
                # pg_stat_statements must be preloaded: set it, then restart once.
                preload = "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
                asyncio.run(self.execute(preload))
                if self.nested:
                    asyncio.run(self.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'"))
                    asyncio.run(self.execute("ALTER SYSTEM SET track_functions = 'all'"))
                self.postgres.stop()
                self.postgres.start()
            if self.nested:
                self.perf = pgperf.PgPerf(self.directory / "perf", self.postmaster_pid)
            self.mongo.start()
        except BaseException:
            self.postgres.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.mongo.stop()
        self.postgres.stop()

    def dsn(self, database: str = "postgres") -> str:
        return self.postgres.dsn(database)

    @property
    def mongo_url(self) -> str:
        return self.mongo.url

    @property
    def postmaster_pid(self) -> int:
        return int((self.postgres.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])

    @property
    def mongo_pid(self) -> int | None:
        # LocalMongo does not publish its process; its CPU and memory are reported apart
        # from Evora's own (a real MongoDB would cost something else).
        proc = self.mongo._proc
        return None if proc is None else proc.pid

    def cpu(self) -> float:
        return procstats.cluster_cpu_seconds(self.postmaster_pid)

    def anon_kib(self) -> int:
        return procstats.cluster_anon_kib(self.postmaster_pid)

    async def execute(self, statement: str, database: str = "postgres") -> None:
        conn = await asyncpg.connect(self.dsn(database))
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    async def fresh_database(self, name: str) -> str:
        """A new empty database `name` (an old one of that name is dropped); its DSN."""
        await self.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await self.execute(f'CREATE DATABASE "{name}"')
        if self.statements:
            await self.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements", name)
        return self.dsn(name)

    async def reset_statements(self, conn: asyncpg.Connection) -> None:
        if self.statements:
            await conn.execute("SELECT pg_stat_statements_reset()")

    async def top_statements(self, conn: asyncpg.Connection, top: int = 10) -> list[str]:
        """The statements of `conn`'s database that took the most time since the reset."""
        if not self.statements:
            return []
        rows = await conn.fetch(
            """
            SELECT calls, total_exec_time, rows, toplevel,
                   left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS q
            FROM pg_stat_statements
            WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND query NOT LIKE '%pg_stat_statements%'
            ORDER BY total_exec_time DESC LIMIT $1
            """,
            top,
        )
        lines = [
            f"{r['total_exec_time']:9.1f} ms {r['calls']:7} calls {r['rows']:8} rows"
            f" {' ' if r['toplevel'] else '>'} {r['q']}"
            for r in rows
        ]
        if self.nested:
            # every function's own time (`>` above: a statement inside a function)
            functions = await conn.fetch(
                "SELECT schemaname || '.' || funcname AS f, calls, total_time, self_time"
                " FROM pg_stat_user_functions ORDER BY self_time DESC LIMIT $1",
                top,
            )
            lines += [
                f"{r['self_time']:9.1f} ms self {r['total_time']:9.1f} ms total {r['calls']:7}"
                f" calls  function {r['f']}"
                for r in functions
            ]
        return lines

    async def settings(self) -> dict[str, str]:
        conn = await asyncpg.connect(self.dsn())
        try:
            return {name: str(await conn.fetchval(f"SHOW {name}")) for name in SETTINGS_SHOWN}
        finally:
            await conn.close()
