"""One SparkSession for the whole suite (a JVM start costs seconds), local[2] with one
shuffle partition and a JIT that starts fast; and a `Pipeline` that runs the archive and
analytics jobs against the test's own PostgreSQL and MongoDB databases.

Spark calls block, so async tests run them in a thread (`asyncio.to_thread`); the jobs'
own PostgreSQL connection runs on a private event loop in that thread.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from pyspark.sql import Row, SparkSession

from evora_services.pipeline.archive import ArchiveResult, archive_events
from evora_services.pipeline.control import ControlDB, Watermark
from evora_services.pipeline.events import ARCHIVE_SCHEMA
from evora_services.pipeline.jdbc import UNIX_SOCKET_JAR, JdbcSource
from evora_services.pipeline.run import RunResult, run_analytics
from evora_services.pipeline.session import SessionOptions, build_session
from evora_services.pipeline.sinks import MongoTarget
from evora_services.pipeline.store import ArchiveStore

JAR = os.environ.get("EVORA_JDBC_JAR", "/usr/share/java/postgresql.jar")

TEST_CONF = {
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "1g",
    # C1 only and the serial collector: a third faster on short jobs, the tests' kind
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")) or not os.path.isfile(JAR):
        # scripts/test.sh installs both; a bare `pytest` elsewhere skips instead of failing
        pytest.skip(f"Spark tests need Java and the PostgreSQL JDBC jar at {JAR}")
    # junixsocket too, where installed, for the tests of URLs that name a Unix socket.
    jars = ",".join([JAR, *([UNIX_SOCKET_JAR] if os.path.isfile(UNIX_SOCKET_JAR) else [])])
    session = build_session(
        SessionOptions(
            os.environ.get("SPARK_TEST_MASTER", "local[2]"), jars, "evora-tests", TEST_CONF
        )
    )
    yield session
    session.stop()


async def sql_totals(pool: asyncpg.Pool, where: str = "true") -> dict[str, dict[str, int]]:
    """Events per queue and name, counted by PostgreSQL."""
    totals: dict[str, dict[str, int]] = {}
    rows = await pool.fetch(
        f"SELECT queue, event, count(*) AS n FROM evora.job_events WHERE {where} GROUP BY 1, 2"
    )
    for r in rows:
        totals.setdefault(r["queue"], {})[r["event"]] = r["n"]
    return totals


@dataclass
class Pipeline:
    spark: SparkSession
    dsn: str
    root: Path
    mongo: MongoTarget

    @property
    def store(self) -> ArchiveStore:
        return ArchiveStore(self.spark, str(self.root))

    @property
    def output(self) -> str:
        return str(self.root / "analytics")

    def source(self) -> JdbcSource:
        return JdbcSource.from_dsn(self.dsn, partitions=2)

    async def archive(
        self, older_than: float = 0.0, before_commit: Callable[[str], None] | None = None
    ) -> ArchiveResult:
        def archive() -> ArchiveResult:
            with ControlDB(self.dsn) as control:
                return archive_events(
                    self.spark,
                    control,
                    self.source(),
                    self.store,
                    older_than_seconds=older_than,
                    before_commit=before_commit,
                    progress_every=1.0,
                )

        return await asyncio.to_thread(archive)

    async def run(self) -> RunResult:
        def run() -> RunResult:
            with ControlDB(self.dsn) as control:
                return run_analytics(
                    self.spark,
                    control,
                    self.source(),
                    self.store,
                    self.output,
                    self.mongo,
                    progress_every=1.0,
                )

        return await asyncio.to_thread(run)

    async def watermark(self) -> Watermark:
        def read() -> Watermark:
            with ControlDB(self.dsn) as control:
                return control.watermark()

        return await asyncio.to_thread(read)

    async def archived_rows(self) -> list[Row]:
        """Every row in the archive's files, committed or not, by seq."""

        def read() -> list[Row]:
            if not self.store.exists(self.store.events_url):
                return []
            df = self.spark.read.schema(ARCHIVE_SCHEMA).parquet(self.store.events_url)
            return df.orderBy("seq").collect()

        return await asyncio.to_thread(read)

    async def output_rows(self, name: str) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            return [
                r.asDict(recursive=True)
                for r in self.spark.read.parquet(f"{self.output}/{name}").collect()
            ]

        return await asyncio.to_thread(read)


@pytest.fixture
def pipeline(
    spark: SparkSession, db_url: str, mongo_url: str, mongo_db_name: str, tmp_path: Path
) -> Pipeline:
    return Pipeline(spark, db_url, tmp_path / "archive", MongoTarget(mongo_url, mongo_db_name))
