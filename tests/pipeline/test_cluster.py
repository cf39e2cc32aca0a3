"""The pipeline on a real Spark standalone cluster: a master and two workers started from the
pip pyspark distribution (`spark-class`), each a child process on loopback with little
memory. `evora pipeline archive` and `run` go to it with `--master spark://...` as separate
processes, as an operator runs them: executors on both workers read PostgreSQL in parallel
`seq` ranges and write the date-partitioned Parquet archive, and the analytics' totals equal
the projector's read models and a SQL count.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pyspark
import pytest
from pymongo.asynchronous.database import AsyncDatabase

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
SPARK_HOME = Path(pyspark.__file__).parent
# Small and quick to start: the machine that runs the tests has two cores and little memory.
JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
WORKER_MEMORY = "768m"
EXECUTOR_MEMORY = "512m"
START_TIMEOUT = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Cluster:
    master_url: str
    worker_dirs: list[Path]

    def executor_logs(self) -> list[str]:
        """Per worker, the stderr of the executors it ran (every application)."""
        return [
            "".join(p.read_text(errors="replace") for p in sorted(d.glob("app-*/*/stderr")))
            for d in self.worker_dirs
        ]


def _wait_for(log: Path, pattern: str, process: subprocess.Popen[bytes]) -> re.Match[str]:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if match := re.search(pattern, text):
            return match
        if process.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{log.name}: no {pattern!r}:\n{text[-3000:]}")


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[Cluster]:
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")) or not os.path.isfile(JAR):
        pytest.fail(f"Spark tests need Java and the PostgreSQL JDBC jar at {JAR}")
    home = tmp_path / "spark"
    conf = home / "conf"  # empty: no spark-env.sh or defaults from elsewhere
    conf.mkdir(parents=True)
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_CONF_DIR": str(conf),
        "SPARK_LOG_DIR": str(home / "logs"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_DAEMON_JAVA_OPTS": JAVA_OPTS,
        # executors start Python workers with the driver's interpreter (this venv), whose
        # editable install makes Evora importable: no PYTHONPATH
    }
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    processes: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = home / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [spark_class, *args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its JVM and the launcher die together below
            )
        processes.append(process)
        return process, log

    try:
        master, master_log = start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(port), "--webui-port", "0",
        )  # fmt: skip
        _wait_for(master_log, r"I have been elected leader", master)
        worker_dirs = []
        for n in (1, 2):
            work = home / f"worker-{n}"
            worker, worker_log = start(
                f"worker-{n}",
                "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                "--cores", "1", "--memory", WORKER_MEMORY, "--work-dir", str(work),
                master_url,
            )  # fmt: skip
            _wait_for(worker_log, r"Successfully registered with master", worker)
            worker_dirs.append(work)
        yield Cluster(master_url, worker_dirs)
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


# One executor per worker, memory bounded, JITs that start fast.
CLUSTER_CONF = {
    "spark.executor.memory": EXECUTOR_MEMORY,
    "spark.executor.cores": "1",
    "spark.cores.max": "2",
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "512m",
    "spark.driver.extraJavaOptions": JAVA_OPTS,
    "spark.executor.extraJavaOptions": JAVA_OPTS,
}


def pipeline_on(
    cluster: Cluster, command: str, env: dict[str, str], *args: str
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
    spark_cluster: Cluster,
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

    # the work ran on the cluster: each worker ran an executor of both applications, and
    # each executor ran tasks (the JDBC range reads among them)
    for n, log in enumerate(spark_cluster.executor_logs(), 1):
        assert "Running task" in log, f"worker {n} ran no task"
    for work in spark_cluster.worker_dirs:
        assert len(list(work.glob("app-*"))) == 2, work
