"""`evora pipeline run`: the analytics over the whole event history.

The history is the archive (every event inside the committed watermark, from Parquet) plus
the live remainder from PostgreSQL over JDBC: what is outside the watermark and below the
outbox horizon taken at the start. The two are disjoint by construction, so nothing is
counted twice even while files of an uncommitted archive run lie in the archive, and the
horizon makes the input a fixed set (every transaction below it has ended), so each output
is computed from the same events although Spark reads the source again for several of them
(caching all events costs more than rereading them at the sizes measured, see
bench/pipeline.py; the per-job table is cached).

Outputs go to Parquet under the output URL, one directory per output, and from there to
MongoDB collections `analytics_<output>` (`analytics_queue_totals` is the documented one:
services/evora_services/pipeline/README.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from evora.readmodels.analytics import ALL_TYPES, COLLECTION_PREFIX
from evora_services.pipeline import analytics
from evora_services.pipeline.control import ControlDB, Watermark
from evora_services.pipeline.events import (
    ARCHIVE_SCHEMA,
    EVENT_COLUMNS,
    MAX_SEQ,
    Rectangle,
    between,
    between_parts,
)
from evora_services.pipeline.jdbc import JdbcSource
from evora_services.pipeline.session import ProgressReporter
from evora_services.pipeline.sinks import MongoTarget, write_mongo, write_parquet
from evora_services.pipeline.store import ArchiveStore, new_run_id

log = logging.getLogger(__name__)

DEFAULT_TOP_REASONS = 5


@dataclass(frozen=True)
class RunResult:
    run_id: str
    as_of: dict[str, Any]
    rows: dict[str, int]  # output name -> rows written


class IncompleteHistory(Exception):
    """The history read does not hold the events PostgreSQL says it should: the archive
    lost files, or was pointed elsewhere. Nothing is written to MongoDB."""


@dataclass(frozen=True)
class LiveSlice:
    """The events outside the archive's rectangle and inside the horizon's (`between`)."""

    archived: Rectangle
    horizon: Rectangle
    events: int
    min_seq: int
    max_seq: int

    @classmethod
    def measure(cls, control: ControlDB, archived: Rectangle, horizon: Rectangle) -> LiveSlice:
        measured = control.measure(between(archived, horizon))
        return cls(archived, horizon, measured.events, measured.min_seq, measured.max_seq)


def read_history(
    spark: SparkSession, source: JdbcSource, store: ArchiveStore, mark: Watermark, live: LiveSlice
) -> DataFrame:
    """Archive plus live events, with EVENT_COLUMNS."""
    parts = []
    if mark.archived:
        if not store.exists(store.events_url):
            raise IncompleteHistory(
                f"{mark.archived} events are archived but {store.events_url} does not exist"
            )
        archived = (
            spark.read.schema(ARCHIVE_SCHEMA)
            .parquet(store.events_url)
            # files of an uncommitted run hold events outside the watermark: not yet ours
            .where(
                (F.col("seq") <= mark.rectangle.upto_seq)
                & (F.col("xid") < mark.rectangle.below_xid)
            )
        )
        parts.append(archived.select(*EVENT_COLUMNS))
    if live.events:
        parts.append(
            source.read(
                spark,
                between_parts(
                    live.archived, live.horizon, source.partitions, live.min_seq, live.max_seq
                ),
            ).select(*EVENT_COLUMNS)
        )
    if not parts:
        return spark.createDataFrame([], ARCHIVE_SCHEMA).select(*EVENT_COLUMNS)
    history = parts[0]
    for part in parts[1:]:
        history = history.unionByName(part)
    return history


def run_analytics(
    spark: SparkSession,
    control: ControlDB,
    source: JdbcSource,
    store: ArchiveStore,
    output_url: str,
    mongo: MongoTarget | None,
    *,
    top_reasons: int = DEFAULT_TOP_REASONS,
    progress_every: float = 10.0,
) -> RunResult:
    with control.locked():
        started = time.perf_counter()
        run_id = new_run_id()
        mark = control.watermark()
        horizon = max(control.horizon(), mark.rectangle.below_xid)
        live = LiveSlice.measure(control, mark.rectangle, Rectangle(MAX_SEQ, horizon))
        expected = mark.archived + live.events
        as_of: dict[str, Any] = {
            "run_id": run_id,
            "at": datetime.now(UTC),
            "events": expected,
            "seq": max(mark.max_seq, live.max_seq),
            "below_xid": horizon,
            "archive": {**mark.rectangle.as_doc(), "events": mark.archived},
        }
        log.info(
            "run %s: %d archived and %d live events (seq up to %d, xid below %d)",
            run_id,
            mark.archived,
            live.events,
            as_of["seq"],
            horizon,
        )
        history = read_history(spark, source, store, mark, live)
        with ProgressReporter(spark, progress_every) as progress:
            outputs = _Outputs(spark, progress, output_url, mongo, run_id, as_of)
            # Three outputs start from the per-job table: computed once, kept in memory
            # (spilling to disk) until the last of them is written.
            jobs = analytics.per_job(history).persist(StorageLevel.MEMORY_AND_DISK)
            totals = outputs.emit("event_totals", analytics.event_totals(history))
            _check_complete(totals, expected)
            outputs.emit("queue_totals", analytics.queue_totals(totals))
            outputs.emit("job_states", analytics.job_states(jobs))
            outputs.emit("rates", analytics.rates(jobs))
            outputs.emit("latency", analytics.latency(jobs))
            jobs.unpersist()
            per_minute = outputs.emit("throughput_minute", analytics.throughput(history, "minute"))
            outputs.emit("throughput_hour", analytics.hourly(per_minute))
            outputs.emit("failure_reasons", analytics.failure_reasons(history, top_reasons))
            # Only once every output is in Parquet: a failed run leaves MongoDB as it was.
            outputs.publish_all()
        log.info(
            "run %s finished in %.1fs: %s",
            run_id,
            time.perf_counter() - started,
            " ".join(f"{k}={v}" for k, v in outputs.rows.items()),
        )
        return RunResult(run_id, as_of, outputs.rows)


def _check_complete(totals: DataFrame, expected: int) -> None:
    read = totals.where(F.col("type") == ALL_TYPES).agg(F.sum("events")).first()
    found = int(read[0] or 0) if read is not None else 0
    if found != expected:
        raise IncompleteHistory(f"read {found} events, expected {expected} (archive plus live)")


class _Outputs:
    """Writes each output to Parquet, then MongoDB from that Parquet (so both hold the same
    rows, and the MongoDB pass does not recompute the output from the events)."""

    def __init__(
        self,
        spark: SparkSession,
        progress: ProgressReporter,
        output_url: str,
        mongo: MongoTarget | None,
        run_id: str,
        as_of: dict[str, Any],
    ) -> None:
        self._spark = spark
        self._progress = progress
        self._base = output_url.rstrip("/")
        self._mongo = mongo
        self._run_id = run_id
        self._as_of = as_of
        self.rows: dict[str, int] = {}
        self._written: dict[str, DataFrame] = {}

    def emit(self, name: str, df: DataFrame) -> DataFrame:
        url = f"{self._base}/{name}"
        with self._progress.step(f"run {self._run_id}: {name}"):
            write_parquet(df, url)
            written = self._spark.read.parquet(url)
            self.rows[name] = written.count()
            log.info("%s: %d rows written to %s", name, self.rows[name], url)
        self._written[name] = written
        return written

    def publish_all(self) -> None:
        if self._mongo is None:
            return
        for name, written in self._written.items():
            collection = COLLECTION_PREFIX + name
            with self._progress.step(f"run {self._run_id}: MongoDB {collection}"):
                stale = write_mongo(
                    written,
                    self._mongo,
                    collection,
                    analytics.KEYS[name],
                    self._run_id,
                    self._as_of,
                )
            if stale:
                log.info("%s: dropped %d documents of earlier runs", collection, stale)
