"""Reading `job_events` from PostgreSQL over JDBC, in parallel ranges of `seq`.

Spark needs the pgjdbc jar (never fetched from Maven at run time: see README.md) and the
`driver` option spelled out, or it answers "No suitable driver". A database URL that names
a Unix socket (`?host=/run/postgresql`, a host that is a path) is reached through
junixsocket's socket factory (Debian: libjunixsocket-java), whose jar joins pgjdbc's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

if TYPE_CHECKING:  # the URL checks run before PySpark is imported, or even installed
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

DRIVER = "org.postgresql.Driver"
DEFAULT_JAR = "/usr/share/java/postgresql.jar"
# junixsocket (Debian's libjunixsocket-java, with its JNI library) and the pgjdbc socket
# factory it provides, which takes the socket file's path as its argument.
UNIX_SOCKET_JAR = "/usr/share/java/junixsocket-common.jar"
UNIX_SOCKET_FACTORY = "org.newsclub.net.unix.AFUNIXSocketFactory$FactoryArg"
DEFAULT_PORT = 5432


class UnusableDatabaseURL(ValueError):
    """The database URL cannot be used over JDBC; the message is one line."""


def unix_socket(dsn: str) -> str | None:
    """The Unix socket file a postgresql:// URL names, as libpq finds it
    (`<directory>/.s.PGSQL.<port>`), or None for a TCP URL."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    directory = query.get("host") or unquote(parts.netloc.rpartition("@")[2].partition(":")[0])
    if not directory.startswith("/"):
        return None
    if "," in directory:
        raise UnusableDatabaseURL(
            f"the database URL names several socket directories ({directory}): JDBC can use one"
        )
    port = query.get("port") or (str(parts.port) if parts.port else str(DEFAULT_PORT))
    return f"{directory.rstrip('/')}/.s.PGSQL.{port}"


# libpq URL parameters pgjdbc understands, under pgjdbc's names. Others (say
# `target_session_attrs`) have no equivalent here and are dropped with a warning.
_PARAMETERS = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "sslpassword": "sslpassword",
    "connect_timeout": "connectTimeout",
    "application_name": "ApplicationName",
    "options": "options",
}


@dataclass(frozen=True)
class JdbcSource:
    url: str
    user: str | None = None
    password: str | None = None
    partitions: int = 4
    # pgjdbc buffers a whole result unless it fetches with a cursor, which this enables.
    fetch_size: int = 10_000

    @classmethod
    def from_dsn(cls, dsn: str, *, partitions: int = 4, fetch_size: int = 10_000) -> JdbcSource:
        """`postgresql://user:password@host:port/db?sslmode=...` (EVORA_DATABASE_URL) as a
        JDBC URL. The host part is kept as written, so several hosts and IPv6 work."""
        parts = urlsplit(dsn)
        hosts = parts.netloc.rpartition("@")[2] or "localhost"
        database = unquote(parts.path.lstrip("/")) or "postgres"
        params = {"ApplicationName": "evora-pipeline"}
        socket = unix_socket(dsn)
        if socket is not None:
            # The host is a placeholder: the factory connects to the socket file. A Unix
            # socket carries no TLS; pgjdbc would otherwise try it first.
            hosts = "localhost"
            params |= {
                "socketFactory": UNIX_SOCKET_FACTORY,
                "socketFactoryArg": socket,
                "sslmode": "disable",
            }
        for key, value in parse_qsl(parts.query):
            if key in {"host", "port"} and socket is not None:
                continue
            if key in _PARAMETERS:
                params[_PARAMETERS[key]] = value
            else:
                log.warning("database URL parameter %r has no JDBC equivalent; ignored", key)
        return cls(
            url=f"jdbc:postgresql://{hosts}/{database}?{urlencode(params)}",
            user=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            partitions=partitions,
            fetch_size=fetch_size,
        )

    @property
    def jars(self) -> list[str]:
        """Jars this source needs besides pgjdbc's."""
        return [UNIX_SOCKET_JAR] if "socketFactoryArg=" in self.url else []

    def options(self) -> dict[str, str]:
        options = {"url": self.url, "driver": DRIVER, "fetchsize": str(self.fetch_size)}
        if self.user is not None:
            options["user"] = self.user
        if self.password is not None:
            # Spark redacts options named like "password" in plans and logs.
            options["password"] = self.password
        return options

    def read(self, spark: SparkSession, queries: Sequence[str]) -> DataFrame:
        """The rows of `queries` (at least one, all with the same columns), each read by a
        query of its own, concurrently as Spark's tasks allow."""
        frames = [
            spark.read.format("jdbc")
            .options(**self.options())
            .option("dbtable", f"({query}) AS events")
            .load()
            for query in queries
        ]
        union = frames[0]
        for frame in frames[1:]:
            union = union.unionByName(frame)
        return union
