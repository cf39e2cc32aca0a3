"""The archive's files, through Hadoop's FileSystem API so that any Hadoop URL works (a
local path, hdfs://, s3a://, gs://, abfs://), the same way Spark itself writes them.

Layout under EVORA_ARCHIVE_URL:

    events/date=YYYY-MM-DD/part-<run id>-<n>.parquet   committed archive runs
    _staging/<run id>/                                  what a run's Spark job wrote

A file belongs to the run named in it. Files of runs that PostgreSQL has no commit for
(a run killed after publishing, before recording its watermark) are removed by the next
archive run before it writes anything, and readers ignore them in the meantime because they
lie outside the committed watermark.
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

EVENTS_DIR = "events"
STAGING_DIR = "_staging"
_FILE = re.compile(r"^part-(?P<run>\d{8}T\d{6}Z-[0-9a-f]{8})-(?P<n>\d{5,})\.parquet$")


def new_run_id(now: datetime | None = None) -> str:
    moment = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"{moment}-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class ArchiveFile:
    url: str
    partition: str  # "date=YYYY-MM-DD"
    run_id: str


class ArchiveStore:
    def __init__(self, spark: SparkSession, root: str) -> None:
        self.root = root.rstrip("/")
        self._spark = spark
        sc = spark.sparkContext
        # py4j handles into the driver JVM: PySpark has no Python API for FileSystem.
        self._jvm: Any = sc._jvm
        self._conf: Any = sc._jsc.hadoopConfiguration()

    @property
    def events_url(self) -> str:
        return f"{self.root}/{EVENTS_DIR}"

    def staging_url(self, run_id: str) -> str:
        return f"{self.root}/{STAGING_DIR}/{run_id}"

    def _path(self, url: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(url)

    def _fs(self, path: Any) -> Any:
        return path.getFileSystem(self._conf)

    def _glob(self, pattern: str) -> list[str]:
        path = self._path(pattern)
        statuses = self._fs(path).globStatus(path)
        return [] if statuses is None else sorted(str(s.getPath().toString()) for s in statuses)

    def exists(self, url: str) -> bool:
        path = self._path(url)
        return bool(self._fs(path).exists(path))

    def delete(self, url: str) -> None:
        path = self._path(url)
        self._fs(path).delete(path, True)

    def files(self) -> list[ArchiveFile]:
        """Every archive file whose name says which run wrote it."""
        found = []
        for url in self._glob(f"{self.events_url}/date=*/part-*.parquet"):
            partition, name = url.rsplit("/", 2)[-2:]
            match = _FILE.match(name)
            if match is None:
                log.warning("ignoring %s: not named by an archive run", url)
                continue
            found.append(ArchiveFile(url, partition, match["run"]))
        return found

    def remove_uncommitted(self, committed: set[str]) -> int:
        """Delete files of runs that never committed, and any staging leftovers. Only safe
        under the exclusive pipeline lock (a run in progress is uncommitted too)."""
        leftovers = [f for f in self.files() if f.run_id not in committed]
        for f in leftovers:
            log.warning("removing %s: its archive run %s never committed", f.url, f.run_id)
            self.delete(f.url)
        staging = f"{self.root}/{STAGING_DIR}"
        if self.exists(staging):
            self.delete(staging)
        return len(leftovers)

    def publish(self, run_id: str) -> list[str]:
        """Move the Parquet files a run staged into the archive under names that carry the
        run id. Renames, so nothing is copied on a real file system."""
        staged = self._glob(f"{self.staging_url(run_id)}/date=*/*.parquet")
        published = []
        for n, url in enumerate(staged):
            partition = url.rsplit("/", 2)[-2]
            target_dir = self._path(f"{self.events_url}/{partition}")
            fs = self._fs(target_dir)
            fs.mkdirs(target_dir)
            target = f"{self.events_url}/{partition}/part-{run_id}-{n:05d}.parquet"
            if not fs.rename(self._path(url), self._path(target)):
                raise OSError(f"could not move {url} to {target}")
            published.append(target)
        return published
