"""The SparkSession the pipeline runs in, and progress reporting while Spark works.

The master comes from `--master`, or from spark-submit when the job was launched by it (then
nothing here overrides it), or is `local[*]`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"


def launched_by_spark_submit() -> bool:
    # spark-submit starts the JVM first and hands the Python driver its gateway.
    return "PYSPARK_GATEWAY_PORT" in os.environ


@dataclass(frozen=True)
class SessionOptions:
    master: str | None = None
    jdbc_jar: str | None = None
    app_name: str = "evora-pipeline"
    conf: Mapping[str, str] = field(default_factory=dict)


def _local_partitions() -> int:
    # About two tasks per core; Spark's default of 200 is pure overhead on one machine.
    return max(2, 2 * (os.cpu_count() or 1))


def build_session(options: SessionOptions) -> SparkSession:
    master = options.master or (None if launched_by_spark_submit() else DEFAULT_MASTER)
    # Python workers run the interpreter that runs the driver (the venv), unless told.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(options.app_name)
    settings: dict[str, str] = {
        "spark.sql.session.timeZone": "UTC",
        # INT96, Spark's default, has no min/max statistics, so no pruning on `at`.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.parquet.compression.codec": "zstd",
        # progress goes to the log (ProgressReporter), not as bars over it
        "spark.ui.showConsoleProgress": "false",
    }
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            settings["spark.driver.bindAddress"] = "127.0.0.1"
            settings["spark.driver.host"] = "127.0.0.1"
    if options.jdbc_jar and not launched_by_spark_submit():
        # The pgjdbc jar by path, never from Maven. Under spark-submit its --jars says it
        # (setting spark.jars here would replace that list).
        settings["spark.jars"] = options.jdbc_jar
    settings.update(options.conf)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    sc.setLogLevel("WARN")
    running_on = sc.master or ""
    if running_on.startswith("local") and not sc.getConf().contains("spark.sql.shuffle.partitions"):
        # also when spark-submit chose local mode; its own --conf would win
        spark.conf.set("spark.sql.shuffle.partitions", str(_local_partitions()))
    log.info(
        "spark %s session on %s (%d cores, %s shuffle partitions)",
        spark.version,
        running_on,
        sc.defaultParallelism,
        spark.conf.get("spark.sql.shuffle.partitions"),
    )
    return spark


class ProgressReporter:
    """Logs, every `every` seconds while Spark works, which stages run and how many of their
    tasks are done; steps log their start, end and duration."""

    def __init__(self, spark: SparkSession, every: float = 10.0) -> None:
        self._spark = spark
        self._every = every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._step = ""

    def __enter__(self) -> ProgressReporter:
        self._thread = threading.Thread(target=self._report, name="spark-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._every + 1)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        self._step = name
        self._spark.sparkContext.setJobDescription(name)
        started = time.perf_counter()
        log.info("%s: started", name)
        try:
            yield
        finally:
            self._spark.sparkContext.setJobDescription(None)  # type: ignore[arg-type]
            log.info("%s: %.1fs", name, time.perf_counter() - started)
            self._step = ""

    def _report(self) -> None:
        tracker = self._spark.sparkContext.statusTracker()
        while not self._stop.wait(self._every):
            try:
                stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            except Exception:  # the context is stopping; reporting is best effort
                return
            for stage in stages:
                if stage is None:
                    continue
                # (PySpark's stage names are internal call sites; the step says more)
                log.info(
                    "%s: stage %d: %d/%d tasks done, %d running",
                    self._step or "spark",
                    stage.stageId,
                    stage.numCompletedTasks,
                    stage.numTasks,
                    stage.numActiveTasks,
                )
