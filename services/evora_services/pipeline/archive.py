"""`evora pipeline archive`: copy old, projected events into the date-partitioned Parquet
archive, verify, and only then move the watermark that lets the sweeper delete them.

One run, under the exclusive pipeline lock:
1. remove files of earlier runs that never committed (killed between 4 and 6);
2. plan: the new archived rectangle (control.plan_archive) and exact counts per UTC day
   of what it adds, from PostgreSQL;
3. read exactly those events over JDBC in seq ranges and write them to a staging directory
   of this run, one Parquet file per day;
4. publish: rename the staged files into events/date=.../ with this run's id in the name;
5. verify the published files: rows per date partition and distinct seqs must equal the
   counts from step 2;
6. commit: advance the watermark (compare-and-set) and record the run, in one transaction.
Killed anywhere before 6, the watermark is unchanged, nothing may be deleted, readers ignore
the run's files (they are outside the committed watermark) and the next run removes them
and archives the same events again. Killed after 6, the run is complete (staging leftovers
are removed next time). So every event is in the archive exactly once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from evora_services.pipeline.control import ArchivePlan, ControlDB
from evora_services.pipeline.events import (
    ARCHIVE_SCHEMA,
    EVENT_COLUMNS,
    Rectangle,
    between_parts,
)
from evora_services.pipeline.jdbc import JdbcSource
from evora_services.pipeline.session import ProgressReporter
from evora_services.pipeline.store import ArchiveStore, new_run_id

log = logging.getLogger(__name__)

# Bounds a Parquet file of a busy day (about 100 MB of events).
MAX_RECORDS_PER_FILE = 1_000_000


class ArchiveVerificationError(Exception):
    """What was written differs from what PostgreSQL holds; the run is not committed."""


@dataclass(frozen=True)
class ArchiveResult:
    run_id: str | None  # None: nothing to archive
    events: int
    watermark: Rectangle
    partitions: dict[str, int] = field(default_factory=dict)
    removed_leftovers: int = 0


def archive_events(
    spark: SparkSession,
    control: ControlDB,
    source: JdbcSource,
    store: ArchiveStore,
    *,
    older_than_seconds: float,
    max_events: int | None = None,
    before_commit: Callable[[str], None] | None = None,
    progress_every: float = 10.0,
) -> ArchiveResult:
    """`before_commit(run_id)` runs after the files are published and verified, just before
    the watermark moves (tests inject a failure there)."""
    with control.locked():
        return _archive(
            spark,
            control,
            source,
            store,
            older_than_seconds=older_than_seconds,
            max_events=max_events,
            before_commit=before_commit,
            progress_every=progress_every,
        )


def _archive(
    spark: SparkSession,
    control: ControlDB,
    source: JdbcSource,
    store: ArchiveStore,
    *,
    older_than_seconds: float,
    max_events: int | None,
    before_commit: Callable[[str], None] | None,
    progress_every: float,
) -> ArchiveResult:
    started = time.perf_counter()
    removed = store.remove_uncommitted(control.committed_runs())
    plan = control.plan_archive(older_than_seconds, max_events)
    if plan.slice.events == 0:
        log.info(
            "archive: nothing to add (watermark %s; events must be older than %s and consumed)",
            plan.old.as_doc(),
            plan.cutoff.isoformat(),
        )
        return ArchiveResult(None, 0, plan.old, removed_leftovers=removed)
    run_id = new_run_id()
    log.info(
        "archive run %s: %d events (seq %d..%d) in %d day partitions, watermark %s -> %s",
        run_id,
        plan.slice.events,
        plan.slice.min_seq,
        plan.slice.max_seq,
        len(plan.slice.per_day),
        plan.old.as_doc(),
        plan.new.as_doc(),
    )
    with ProgressReporter(spark, progress_every) as progress:
        with progress.step(f"archive {run_id}: read and stage {plan.slice.events} events"):
            _stage(spark, source, store, run_id, plan)
        with progress.step(f"archive {run_id}: publish"):
            published = store.publish(run_id)
        with progress.step(f"archive {run_id}: verify {len(published)} files"):
            _verify(spark, store, published, plan)
    if before_commit is not None:
        before_commit(run_id)
    control.commit(run_id, plan)
    store.delete(store.staging_url(run_id))
    partitions = {day.isoformat(): n for day, n in sorted(plan.slice.per_day.items())}
    took = time.perf_counter() - started
    log.info(
        "archive run %s committed: %d events, watermark %s; finished in %.1fs (%.0f events/s)",
        run_id,
        plan.slice.events,
        plan.new.as_doc(),
        took,
        plan.slice.events / took,
    )
    return ArchiveResult(run_id, plan.slice.events, plan.new, partitions, removed)


def _stage(
    spark: SparkSession, source: JdbcSource, store: ArchiveStore, run_id: str, plan: ArchivePlan
) -> None:
    events = source.read(
        spark,
        between_parts(
            plan.old, plan.new, source.partitions, plan.slice.min_seq, plan.slice.max_seq
        ),
    )
    (
        events.select(*EVENT_COLUMNS)
        # the session time zone is UTC, so this is the UTC day, as PostgreSQL counted it
        .withColumn("date", F.to_date("at"))
        # one file per day and run, not one per day and JDBC partition
        .repartition("date")
        .sortWithinPartitions("seq")
        .write.partitionBy("date")
        .option("maxRecordsPerFile", MAX_RECORDS_PER_FILE)
        .parquet(store.staging_url(run_id))
    )


def _verify(spark: SparkSession, store: ArchiveStore, files: list[str], plan: ArchivePlan) -> None:
    if not files:
        raise ArchiveVerificationError("the run published no files")
    written = (
        spark.read.schema(ARCHIVE_SCHEMA)
        .option("basePath", store.events_url)
        .parquet(*files)
        .groupBy("date")
        .agg(F.count(F.lit(1)).alias("rows"), F.count_distinct("seq").alias("seqs"))
        .collect()
    )
    found: dict[date, int] = {}
    for row in written:
        if row["rows"] != row["seqs"]:
            raise ArchiveVerificationError(f"date={row['date']}: duplicate seqs in the files")
        found[row["date"]] = int(row["rows"])
    if found != plan.slice.per_day:
        expected = _days(plan.slice.per_day)
        raise ArchiveVerificationError(
            f"rows per date partition {_days(found)} differ from PostgreSQL's {expected}"
        )
    log.info("verified %d events in %d date partitions", sum(found.values()), len(found))


def _days(counts: dict[date, int]) -> dict[str, int]:
    return {day.isoformat(): n for day, n in sorted(counts.items())}
