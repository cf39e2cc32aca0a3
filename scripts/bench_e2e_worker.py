#!/usr/bin/env python3
"""Worker process of `scripts/bench_e2e.py`: one `evora.Worker` with a no-op handler.

The handler records `time.time()` (the host's wall clock, which the benchmark process
reads too) and the payload's sequence number `i` when it starts. On SIGTERM/SIGINT the
worker shuts down gracefully (SDK behaviour) and this process writes what it recorded,
plus its own CPU time and peak RSS, as JSON to `--out`.

With BENCH_E2E_TRACEMALLOC=PREFIX in the environment it also writes the largest allocation
sites still alive at exit to PREFIX-<pid>.txt (memory diagnosis; slows the worker a lot).

Not meant to be run by hand; `bench_e2e.py` starts it:

    python scripts/bench_e2e_worker.py --url URL --token TOKEN --queue Q --concurrency N --out F
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import signal
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from evora.sdk.handlers import Handlers, Job
from evora.sdk.worker import Worker

JOB_TYPE = "bench.noop"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", required=True, help="dispatcher base URL")
    parser.add_argument("--token", required=True, help="worker token")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--wait-seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path, required=True, help="JSON file written at exit")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )

    # (payload i, wall clock at handler start); -1 when the payload has no integer "i".
    starts: list[tuple[int, float]] = []
    handlers = Handlers()

    @handlers.job(JOB_TYPE)
    async def noop(job: Job) -> None:
        now = time.time()
        payload = job.payload
        seq = payload.get("i", -1) if isinstance(payload, dict) else -1
        starts.append((seq if isinstance(seq, int) else -1, now))

    worker = Worker(
        args.url,
        args.token,
        [args.queue],
        args.concurrency,
        handlers=handlers,
        wait_seconds=args.wait_seconds,
        grace_period=10.0,
    )
    trace_prefix = os.environ.get("BENCH_E2E_TRACEMALLOC")
    if trace_prefix:
        # Diagnosis of the worker's memory: what is still allocated when it stops.
        tracemalloc.start(8)
    worker.run()
    if trace_prefix:
        snapshot = tracemalloc.take_snapshot()
        top = snapshot.statistics("traceback")[:12]
        lines = [f"traced now {tracemalloc.get_traced_memory()}; largest allocation sites:"]
        for stat in top:
            lines.append(f"{stat.size / 1024:10.0f} KiB in {stat.count} blocks")
            lines.extend(f"      {line}" for line in stat.traceback.format(limit=8))
        Path(f"{trace_prefix}-{os.getpid()}.txt").write_text("\n".join(lines))
    # run() restored the default SIGTERM action; a late second signal must not cut the report.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    usage = resource.getrusage(resource.RUSAGE_SELF)
    report: dict[str, Any] = {
        "pid": os.getpid(),
        "worker_id": worker.settings.worker_id,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "maxrss_kib": usage.ru_maxrss,
        "starts": starts,
    }
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report))
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
