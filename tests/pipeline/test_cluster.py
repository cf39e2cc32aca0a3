"""The pipeline on a real Spark standalone cluster: a master and a worker of two cores started
from the pip pyspark distribution (`spark-class`), each a child process on loopback with little
memory. `evora pipeline archive` and `run` go to it with `--master spark://...` as separate
processes, as an operator runs them: two executors (processes of their own, as on two
machines) read PostgreSQL in parallel `seq` ranges and write the date-partitioned Parquet
archive, and the analytics' totals equal the projector's read models and a SQL count.

One worker daemon launches both executors: a second worker JVM would only prove Spark's own
registration of several workers (about 8 s of CPU a worker daemon, measured), while what
Evora needs of a cluster (executors apart from the driver and from each other, fetching the
JDBC jar, importing Evora in their Python workers, writing one archive) is the same.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from pymongo.asynchronous.database import AsyncDatabase

from bench.spark_standalone import StandaloneCluster
from evora.readmodels.layout import TOTAL_KEYS, Document
from evora.storage.jobs import JobStore
from evora_services.projector.projector import Projector
from tests.conftest import Clock
from tests.pipeline.conftest import JAR, sql_totals
from tests.pipeline.test_history import DAY, add, sweeper_dropping_events
from tests.projector.conftest import catch_up
from tests.projector.workload import mixed_workload

QUEUES = ["alpha", "beta"]
REPO = Path(__file__).resolve().parents[2]
# Small and quick to start: the machine that runs the tests has two cores and little memory.
# Spark's JVMs load 70-140 MB of class metadata: from the default MetaspaceSize (21 MB) on,
# each step of that growth ran a full collection ("Metadata GC Threshold": 3-4 in each
# driver and executor, 2 in the master and the worker; -Xlog:gc), the only full collections
# these JVMs ran. The threshold is not a reservation: memory is taken as classes load.
JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:MetaspaceSize=256m"
# A young generation of half the heap (a third by default) halves the young collections of
# drivers and executors (the run's driver 19 -> 10, its executors 9 -> 6). With the full
# collections gone, their GC pauses went from 7.5 s to 4.4 s a test (-Xlog:gc).
SPARK_JAVA_OPTS = f"{JAVA_OPTS} -Xmn256m"
EXECUTORS = 2  # of one core each, both on the one worker
EXECUTOR_MEMORY = "512m"
WORKER_MEMORY = f"{EXECUTORS * 512}m"


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[StandaloneCluster]:
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")) or not os.path.isfile(JAR):
        pytest.fail(f"Spark tests need Java and the PostgreSQL JDBC jar at {JAR}")
    cluster = StandaloneCluster(
        tmp_path / "spark",
        workers=1,
        worker_cores=EXECUTORS,
        worker_memory=WORKER_MEMORY,
        daemon_java_opts=JAVA_OPTS,
    )
    with cluster:
        yield cluster


# Two executors of one core, memory bounded, JITs that start fast.
CLUSTER_CONF = {
    "spark.executor.memory": EXECUTOR_MEMORY,
    "spark.executor.cores": "1",
    "spark.cores.max": str(EXECUTORS),
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "512m",
    "spark.driver.extraJavaOptions": SPARK_JAVA_OPTS,
    "spark.executor.extraJavaOptions": SPARK_JAVA_OPTS,
}


def pipeline_on(
    cluster: StandaloneCluster, command: str, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """`python -m evora_services.pipeline COMMAND --master spark://...` run to its end."""
    conf = [arg for key, value in CLUSTER_CONF.items() for arg in ("--conf", f"{key}={value}")]
    options = ["--master", cluster.master_url, "--jdbc-jar", JAR, "--jdbc-partitions", "4"]
    done = subprocess.run(
        [sys.executable, "-m", "evora_services.pipeline", command, *options, *conf, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, f"pipeline {command}:\n{done.stdout}\n{done.stderr[-5000:]}"
    return done


async def test_archive_and_run_on_a_standalone_cluster(
    spark_cluster: StandaloneCluster,
    store: JobStore,
    pool: asyncpg.Pool,
    mongo: AsyncDatabase[Document],
    db_url: str,
    mongo_url: str,
    mongo_db_name: str,
    tmp_path: Path,
    clock: Clock,
) -> None:
    archive_url = tmp_path / "archive"
    env = {
        **os.environ,
        "EVORA_DATABASE_URL": db_url,
        "EVORA_MONGO_URL": mongo_url,
        "EVORA_MONGO_DB": mongo_db_name,
        "EVORA_ARCHIVE_URL": str(archive_url),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    await mixed_workload(store, pool, jobs=600, queues=QUEUES, seed=11)
    projector = Projector(pool, mongo, 1, batch_size=500)
    await catch_up(projector)
    before = await sql_totals(pool)
    newest = await pool.fetchval("SELECT max(seq) FROM evora.job_events")

    pipeline_on(spark_cluster, "archive", env, "--older-than", "0")
    # the committed rectangle holds exactly the events PostgreSQL counts in it
    archived = await pool.fetchval(
        "SELECT count(*) FROM evora.job_events e, evora.event_archive_watermark w"
        " WHERE e.seq <= w.upto_seq AND e.xid < w.below_xid"
    )
    assert archived > 0
    assert await pool.fetchval("SELECT archived FROM evora.event_archive_watermark") == archived
    # partitioned Parquet, by UTC day
    days = sorted(p.name for p in (archive_url / "events").glob("date=*"))
    assert days and all(re.fullmatch(r"date=\d{4}-\d{2}-\d{2}", d) for d in days)
    assert list((archive_url / "events").glob("date=*/part-*.parquet"))
    # the archived events leave PostgreSQL; more history stays live
    await clock.advance(2 * DAY)  # past the end of the partition these events are in
    removed = await sweeper_dropping_events(pool).prune_due()
    assert removed["event_partitions"] >= 1
    assert await pool.fetchval("SELECT count(*) FROM evora.job_events") == (
        sum(sum(t.values()) for t in before.values()) - archived
    )
    await mixed_workload(store, pool, jobs=300, queues=[*QUEUES, "gamma"], seed=12)
    await catch_up(projector)
    truth = add(before, await sql_totals(pool, f"seq > {newest}"))

    pipeline_on(spark_cluster, "run", env)
    analytics = {d["_id"]: d async for d in mongo["analytics_queue_totals"].find({})}
    projected = {d["_id"]: d async for d in mongo["rm1_queues"].find({})}
    assert set(analytics) == set(projected) == set(truth) == {*QUEUES, "gamma"}
    for queue, expected in truth.items():
        assert analytics[queue]["by_event"] == expected, queue
        assert analytics[queue]["totals"] == {k: expected.get(k, 0) for k in TOTAL_KEYS}, queue
        assert {k: v for k, v in projected[queue]["totals"].items() if v} == expected, queue
    assert analytics[QUEUES[0]]["as_of"]["archive"]["events"] == archived

    # the work ran on the cluster: both applications ran two executors each, and every
    # executor ran tasks (the JDBC range reads among them)
    executors = spark_cluster.executor_logs()
    apps = {name.split("/")[0] for name in executors}
    assert len(apps) == 2 and len(executors) == 2 * EXECUTORS, sorted(executors)
    for name, log in executors.items():
        assert "Running task" in log, f"executor {name} ran no task"
