"""A Spark standalone cluster on this machine: a master and N workers started from the pip
pyspark distribution (`spark-class`), each a child process on loopback. Used by the
pipeline benchmark (`--master standalone`) and by tests/pipeline/test_cluster.py."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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


@dataclass
class StandaloneCluster:
    """`with StandaloneCluster(home, ...) as cluster:` a master and `workers` workers of
    `worker_cores` cores and `worker_memory` each, stopped (their process groups) on exit."""

    home: Path
    workers: int = 2
    worker_memory: str = "1280m"
    worker_cores: int = 1
    daemon_memory: str = "256m"
    daemon_java_opts: str = ""

    def __post_init__(self) -> None:
        self.master_url = ""
        self.worker_dirs: list[Path] = []
        self._processes: list[subprocess.Popen[bytes]] = []

    def executor_logs(self) -> dict[str, str]:
        """The stderr of every executor the workers ran, by its `app-.../<executor id>`."""
        return {
            f"{p.parent.parent.name}/{p.parent.name}": p.read_text(errors="replace")
            for d in self.worker_dirs
            for p in sorted(d.glob("app-*/*/stderr"))
        }

    def __enter__(self) -> Self:
        conf = self.home / "conf"  # empty: no spark-env.sh or defaults from elsewhere
        conf.mkdir(parents=True)
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_CONF_DIR": str(conf),
            "SPARK_LOG_DIR": str(self.home / "logs"),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            "SPARK_DAEMON_JAVA_OPTS": self.daemon_java_opts,
            # Applications come over the master's RPC port; its REST submission server would
            # only take port 6066, the same for every cluster on the machine.
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            # executors start Python workers with the driver's interpreter (this venv), whose
            # editable install makes Evora importable: no PYTHONPATH
        }
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        port = free_port()
        self.master_url = f"spark://127.0.0.1:{port}"

        def start(name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
            log = self.home / f"{name}.log"
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [spark_class, *args],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its JVM and the launcher die together below
                )
            self._processes.append(process)
            return process, log

        try:
            master, master_log = start(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1", "--port", str(port), "--webui-port", "0",
            )  # fmt: skip
            _wait_for(master_log, r"I have been elected leader", master)
            for n in range(1, self.workers + 1):
                work = self.home / f"worker-{n}"
                worker, worker_log = start(
                    f"worker-{n}",
                    "org.apache.spark.deploy.worker.Worker",
                    "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                    "--cores", str(self.worker_cores), "--memory", self.worker_memory,
                    "--work-dir", str(work),
                    self.master_url,
                )  # fmt: skip
                _wait_for(worker_log, r"Successfully registered with master", worker)
                self.worker_dirs.append(work)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        for process in reversed(self._processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._processes.clear()
