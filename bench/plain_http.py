"""Drain throughput of the plain HTTP reference worker (examples/plain_http_worker.py: aiohttp
and JSON, no SDK) next to the Python SDK worker, on the same Evora deployment in the same run
(issue #33: the plain worker drains at least 80 % of what the SDK worker does).

Each round drains N no-op jobs with each worker in turn, as `bench.typescript_worker` drains
them (a queue of their own, timed from the worker's READY until PostgreSQL shows every job
COMPLETED), the order reversed every other round. Both hold at most `--concurrency` jobs: the SDK
worker as its concurrency, the plain one as `--lanes` claim loops of concurrency / lanes
jobs each. Prints every drain, then per worker the median and spread of jobs/s and the
ratio of the medians.

    python -m bench.plain_http [--jobs 20000] [--concurrency 100] [--lanes 2] [--rounds 3]
                               [--acks-apart]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from datetime import UTC, datetime

from bench import procstats
from bench.typescript_worker import PYTHON_WORKER, REPO, Deployment, Drain, deployment, measure
from evora import loops

# The reference worker run as its file is run by hand, after a READY line for the harness;
# `bench.typescript_worker.drain` passes url, token, queue, job type and concurrency. The
# token goes where the example reads it, the environment.
PLAIN_WORKER = """
import os, runpy, sys
url, token, queue, job_type, concurrency, path, lanes, apart = sys.argv[1:9]
os.environ["EVORA_WORKER_TOKEN"] = token
argv = [url, queue, "--type", job_type, "--lanes", lanes,
        "--max-jobs", str(int(concurrency) // int(lanes))]
print("READY", flush=True)
if apart == "no":
    sys.argv = [path, *argv]
    runpy.run_path(path, run_name="__main__")
else:
    # For comparison only: the outcomes go by POST /v1/acks just before each claim instead
    # of riding in it (one more request per batch); the claim and its results are as before.
    example = runpy.run_path(path)

    class AcksApart(example["PlainWorker"]):
        async def post(self, http, path, body):
            if path != "/v1/claim" or not body["acks"]:
                return await super().post(http, path, body)
            results = (await super().post(http, "/v1/acks", {"acks": body["acks"]}))["results"]
            answer = await super().post(http, path, {**body, "acks": []})
            return {**answer, "results": results}

    example["main"].__globals__["PlainWorker"] = AcksApart
    example["main"](argv)
"""


def summary(name: str, drains: list[Drain]) -> str:
    rates = sorted(d.rate for d in drains)
    return (
        f"{name:<11} median {statistics.median(rates):8.0f} jobs/s over {len(rates)} rounds "
        f"(min {rates[0]:.0f}, max {rates[-1]:.0f}); worker CPU median "
        f"{statistics.median(d.cpu_seconds for d in drains):.2f} s"
    )


def main(args: argparse.Namespace) -> None:
    with deployment() as on:
        compare(args, on)


def compare(args: argparse.Namespace, on: Deployment) -> None:
    """The rounds on deployment `on`, and their report."""
    script = str(REPO / "examples" / "plain_http_worker.py")
    # `measure` appends url, token, queue, type and concurrency; the plain worker's own
    # arguments follow those.
    workers = {
        "sdk": [sys.executable, "-c", PYTHON_WORKER],
        "plain-http": [sys.executable, "-c", PLAIN_WORKER],
    }
    results = loops.run(
        measure(
            args,
            on,
            workers,
            extra={"plain-http": [script, str(args.lanes), "yes" if args.acks_apart else "no"]},
            alternate=True,
        )
    )
    print(
        f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {procstats.cpu_model()}, "
        f"{procstats.memory_total_gib():.0f} GiB, Python {platform.python_version()}, "
        f"{args.jobs} jobs a drain, concurrency {args.concurrency}, {args.lanes} lanes"
        + (", plain worker's outcomes by POST /v1/acks beside the claim" if args.acks_apart else "")
    )
    by_worker = {name: [r for r in results if r.worker == name] for name in workers}
    for name, drains in by_worker.items():
        print(summary(name, drains))
    sdk, plain = (statistics.median(d.rate for d in by_worker[n]) for n in workers)
    ratios = [
        p.rate / s.rate for s, p in zip(by_worker["sdk"], by_worker["plain-http"], strict=True)
    ]
    print(
        f"plain-http / sdk: {plain / sdk:.0%} of the medians; per round "
        + ", ".join(f"{r:.0%}" for r in ratios)
        + " (in order)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--lanes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--acks-apart",
        action="store_true",
        help="the plain worker sends outcomes by POST /v1/acks before each claim, not in it",
    )
    main(parser.parse_args())
