"""`evora pipeline archive|run`: configuration checks, the Spark session, and the two jobs.

PySpark is an optional extra, so it is imported only once the checks passed.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
from typing import TYPE_CHECKING

from evora.config import ConfigError, Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

JDBC_JAR_ENV = "EVORA_JDBC_JAR"


def _jdbc_jars(args: argparse.Namespace, database_url: str) -> str | None:
    """spark.jars: pgjdbc's, and junixsocket's for a URL that names a Unix socket."""
    from evora_services.pipeline.jdbc import DEFAULT_JAR, JdbcSource
    from evora_services.pipeline.session import launched_by_spark_submit

    explicit: str | None = args.jdbc_jar or os.environ.get(JDBC_JAR_ENV)
    if launched_by_spark_submit() and explicit is None:
        return None  # spark-submit --jars provides them
    jar = explicit or DEFAULT_JAR
    if "://" not in jar and not os.path.isfile(jar):
        raise ConfigError(
            f"the PostgreSQL JDBC driver is not at {jar}: install libpostgresql-jdbc-java "
            f"(Debian) or point --jdbc-jar / {JDBC_JAR_ENV} at a pgjdbc jar"
        )
    return ",".join([jar, *JdbcSource.from_dsn(database_url).jars])


def _check_database_url(database_url: str) -> None:
    """Every URL the services accept either works over JDBC or fails here, in one line,
    before Spark starts (not deep inside it with "Couldn't connect")."""
    from evora_services.pipeline.jdbc import UNIX_SOCKET_JAR, UnusableDatabaseURL, unix_socket

    try:
        socket = unix_socket(database_url)
    except UnusableDatabaseURL as exc:
        raise ConfigError(f"EVORA_DATABASE_URL: {exc}") from None
    if socket is None:
        return
    if not os.path.isfile(UNIX_SOCKET_JAR):
        raise ConfigError(
            f"EVORA_DATABASE_URL names a Unix socket ({socket}): JDBC reaches it through "
            f"junixsocket, not at {UNIX_SOCKET_JAR}: install libjunixsocket-java (Debian) or "
            "use a host:port URL"
        )
    if not os.path.exists(socket):
        raise ConfigError(
            f"EVORA_DATABASE_URL names a Unix socket that does not exist ({socket}): is "
            "PostgreSQL running, with that socket directory and port?"
        )


# What to install for Spark's JVM, where it is missing.
_INSTALL_JAVA = (
    "install a Java runtime (Debian/Ubuntu: apt-get install default-jre-headless or "
    "openjdk-17-jre-headless, and libpostgresql-jdbc-java for the JDBC driver; macOS: brew "
    "install openjdk@17)"
)


def _check_java() -> None:
    # Spark starts $JAVA_HOME/bin/java when JAVA_HOME is set, else `java` from PATH.
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        if not os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
            raise ConfigError(
                f"Spark needs Java 17 or newer: JAVA_HOME={java_home} has no bin/java; "
                f"{_INSTALL_JAVA} and point JAVA_HOME at it, or unset JAVA_HOME"
            )
    elif not shutil.which("java"):
        raise ConfigError(
            f"Spark needs Java 17 or newer: no `java` on PATH and no JAVA_HOME; {_INSTALL_JAVA} "
            "or set JAVA_HOME"
        )


def _check(args: argparse.Namespace, settings: Settings) -> None:
    if settings.database_url is None:
        raise ConfigError(
            "EVORA_DATABASE_URL is required: start `evora dev` (bash scripts/run.sh), whose "
            "databases are then used, or set it"
        )
    if args.pipeline_command == "run" and not args.no_mongo and settings.mongo_url is None:
        raise ConfigError("EVORA_MONGO_URL is required (or pass --no-mongo)")
    if importlib.util.find_spec("pyspark") is None:
        raise ConfigError(
            "evora pipeline needs PySpark: pip install 'evora-queue[pipeline]' (from a clone: "
            "pip install -e '.[pipeline]', or bash scripts/run.sh --with-pipeline)"
        )
    _check_java()
    _check_database_url(settings.database_url)


def run_command(
    args: argparse.Namespace, settings: Settings, spark: SparkSession | None = None
) -> int:
    """Run `evora pipeline <archive|run>`; with `spark` given (tests), in that session and
    without stopping it."""
    _check(args, settings)
    from evora_services.pipeline.session import SessionOptions, build_session

    owned = spark is None
    if spark is None:
        conf = dict(_pairs(args.conf or []))
        assert settings.database_url is not None
        jars = _jdbc_jars(args, settings.database_url)
        spark = build_session(SessionOptions(args.master, jars, conf=conf))
    try:
        if args.pipeline_command == "archive":
            return _archive(args, settings, spark)
        return _run(args, settings, spark)
    finally:
        if owned:
            spark.stop()


def _pairs(items: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--conf {item!r} is not KEY=VALUE")
        pairs.append((key.strip(), value.strip()))
    return pairs


def _archive(args: argparse.Namespace, settings: Settings, spark: SparkSession) -> int:
    from evora_services.pipeline.archive import ArchiveVerificationError, archive_events
    from evora_services.pipeline.control import ArchiveConflict, ControlDB
    from evora_services.pipeline.jdbc import JdbcSource
    from evora_services.pipeline.store import ArchiveStore

    assert settings.database_url is not None
    older_than = (
        args.older_than if args.older_than is not None else settings.retention_events_seconds
    )
    source = JdbcSource.from_dsn(settings.database_url, partitions=args.jdbc_partitions)
    store = ArchiveStore(spark, args.archive_url or settings.archive_location)
    with ControlDB(settings.database_url) as control:
        try:
            result = archive_events(
                spark,
                control,
                source,
                store,
                older_than_seconds=older_than,
                max_events=args.max_events,
                progress_every=args.progress_every,
            )
        except (ArchiveConflict, ArchiveVerificationError) as exc:
            log.error("archive run not committed: %s", exc)
            return 1
    if result.run_id is None:
        print(f"nothing to archive; watermark {result.watermark.as_doc()}")
    else:
        print(
            f"archived {result.events} events in run {result.run_id} "
            f"to {store.events_url}; watermark {result.watermark.as_doc()}"
        )
    return 0


def _run(args: argparse.Namespace, settings: Settings, spark: SparkSession) -> int:
    from evora_services.pipeline.control import ControlDB
    from evora_services.pipeline.jdbc import JdbcSource
    from evora_services.pipeline.run import IncompleteHistory, run_analytics
    from evora_services.pipeline.sinks import MongoTarget
    from evora_services.pipeline.store import ArchiveStore

    assert settings.database_url is not None
    archive_url = args.archive_url or settings.archive_location
    output = args.output or f"{archive_url.rstrip('/')}/analytics"
    mongo = None
    if not args.no_mongo:
        assert settings.mongo_url is not None
        mongo = MongoTarget(settings.mongo_url, settings.mongo_db)
    source = JdbcSource.from_dsn(settings.database_url, partitions=args.jdbc_partitions)
    with ControlDB(settings.database_url) as control:
        try:
            result = run_analytics(
                spark,
                control,
                source,
                ArchiveStore(spark, archive_url),
                output,
                mongo,
                top_reasons=args.top_reasons,
                progress_every=args.progress_every,
            )
        except IncompleteHistory as exc:
            log.error("run abandoned: %s", exc)
            return 1
    print(
        f"analytics run {result.run_id} over {result.as_of['events']} events "
        f"(seq up to {result.as_of['seq']}) written to {output}"
        + ("" if mongo is None else f" and MongoDB {mongo.database}.analytics_*")
    )
    return 0
