"""`python -m bench.service_start`: the CPU each `evora` service process spends from its start
to ready (/readyz 200) to its exit on SIGTERM, and `evora migrate`'s on an up-to-date
database: what each of the ~290 service processes the test suite starts pays, and what a
production start or restart pays.

    python -m bench.service_start                 # 5 repetitions, medians
    python -m bench.service_start --repeat 9 --services sweeper,dispatcher

One PostgreSQL (in /dev/shm when it exists) and one MongoDB-wire server serve every run;
each figure is the process's own user+sys CPU (getrusage of the waited-for child), so the
load of other processes on the machine changes it little, unlike wall time.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from evora.embedded.mongo import LocalMongo
from evora.embedded.postgres import LocalPostgres

SERVICES = ("api", "dispatcher", "sweeper", "projector")
READY_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.02
TOKENS = "admin:bench-admin-token-0000,producer:bench-producer-token0,worker:bench-worker-token-000"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _evora() -> list[str]:
    return [sys.executable, "-m", "evora_services.cli"]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the service exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(POLL_INTERVAL_S)
    raise RuntimeError(f"{url} not ready in {READY_TIMEOUT_S} s")


def service_cpu(service: str, env: Mapping[str, str], log: Path) -> float:
    """CPU seconds of one `evora SERVICE` from its start to its exit on SIGTERM once ready."""
    port = _free_port()
    env = {**env, f"EVORA_{service.upper()}_PORT": str(port)}
    before = _children_cpu()
    with log.open("ab") as out:
        proc = subprocess.Popen([*_evora(), service], env=env, stdout=out, stderr=out)
        try:
            _wait_ready(f"http://127.0.0.1:{port}/readyz", proc)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(EXIT_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if code != 0:
        raise RuntimeError(f"evora {service} exited with {code} (see {log})")
    return _children_cpu() - before


def migrate_cpu(env: Mapping[str, str], log: Path) -> float:
    before = _children_cpu()
    with log.open("ab") as out:
        subprocess.run([*_evora(), "migrate"], env=env, stdout=out, stderr=out, check=True)
    return _children_cpu() - before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--services", default=",".join((*SERVICES, "migrate")))
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.services.split(",") if n.strip()]
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
        root = Path(tmp)
        postgres = LocalPostgres(root / "pg", durable=False)
        mongo = LocalMongo(":memory:")
        postgres.start()
        mongo.start()
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("EVORA_", "OTEL_"))}
            env |= {
                "EVORA_DATABASE_URL": postgres.dsn(),
                "EVORA_MONGO_URL": mongo.url,
                "EVORA_TOKENS": TOKENS,
                "EVORA_HOST": "127.0.0.1",
                "EVORA_LOG_FORMAT": "json",
            }
            log = root / "services.log"
            migrate_cpu(env, log)  # the first one applies the migrations; not counted
            cpu: dict[str, list[float]] = {name: [] for name in names}
            for _ in range(args.repeat):  # interleaved, so drifting load spreads over all
                for name in names:
                    run = (
                        migrate_cpu(env, log) if name == "migrate" else service_cpu(name, env, log)
                    )
                    cpu[name].append(run)
        finally:
            mongo.stop()
            postgres.stop()
    print(f"{'command':<17} {'median CPU s':>12}  runs")
    for name, runs in cpu.items():
        shown = " ".join(f"{r:.2f}" for r in runs)
        print(f"{'evora ' + name:<17} {statistics.median(runs):>12.3f}  {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
