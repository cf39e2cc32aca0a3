"""What flow control costs the claim (docs/flow-control.md): submit, claim and complete jobs
through the job store on one durable PostgreSQL, with no limit defined or with 1,000 keys
each limited, and print the drain's throughput and the claim's latency.

    python -m bench.limits --phase none    # no limit defined
    python -m bench.limits --phase keys    # 1,000 keys, each concurrency 5 and 500 claims/s

Only `evora.storage` and `evora.embedded` are used, and limits are defined in SQL, so the
`none` phase runs unchanged on a checkout from before flow control: an A/B of the claim is
this file run with each checkout's `shared/` first on PYTHONPATH. Measured in-process, so
the figures are the store's (claim and complete statements, their commits), without HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from evora.embedded import LocalPostgres
from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import Completion, JobStore
from evora.storage.migrate import apply_migrations

QUEUE = "bench-limits"
KEYS = 1000
BATCH = 1000


def _submissions(count: int, keyed: bool) -> list[JobSubmission]:
    # Validated from a mapping: the `none` phase also runs on checkouts from before
    # flow control, whose submissions have no `limit_keys` field.
    return [
        JobSubmission.model_validate(
            {
                "queue": QUEUE,
                "type": "bench.noop",
                "payload": {"n": n},
                **({"limit_keys": [f"tenant:{n % KEYS}"]} if keyed else {}),
            }
        )
        for n in range(count)
    ]


# Every key limited by its own row (a prefix limit would be one row for all of them).
LIMIT_EVERY_KEY = """
INSERT INTO evora.flow_limits (key, concurrency, rate_limit, rate_per_seconds)
SELECT 'tenant:' || n, 5, 500, 1 FROM generate_series(0, $1 - 1) AS n
"""


async def _run(args: argparse.Namespace, directory: Path) -> None:
    with LocalPostgres(directory / "pg", durable=True) as server:
        dsn = server.dsn()
        await apply_migrations(dsn)
        pool = await create_pool(dsn, min_size=args.claimers + 2, max_size=args.claimers + 2)
        store = JobStore(pool)
        keyed = args.phase == "keys"
        if keyed:
            await pool.execute(LIMIT_EVERY_KEY, KEYS)
        jobs = _submissions(args.jobs, keyed)
        started = time.perf_counter()
        for first in range(0, len(jobs), BATCH):
            await store.submit_batch(jobs[first : first + BATCH])
        submit_s = time.perf_counter() - started
        async with pool.acquire() as conn:
            await conn.execute("VACUUM ANALYZE evora.jobs")

        latencies: list[float] = []
        done = 0

        async def claimer(n: int) -> None:
            nonlocal done
            empty = 0
            while done < args.jobs and empty < 50:
                began = time.perf_counter()
                claimed = await store.claim(
                    worker_id=f"bench-{n}", queues=[QUEUE], max_jobs=args.max_jobs
                )
                latencies.append(time.perf_counter() - began)
                if not claimed:
                    empty += 1
                    await asyncio.sleep(0.002)
                    continue
                empty = 0
                await store.complete_many(
                    [Completion(j["id"], j["lease_token"]) for j in claimed], with_jobs=False
                )
                done += len(claimed)

        started = time.perf_counter()
        await asyncio.gather(*(claimer(n) for n in range(args.claimers)))
        drain_s = time.perf_counter() - started
        await store.close()
        await pool.close()
    cuts = statistics.quantiles(latencies, n=100)
    print(
        f"phase={args.phase} jobs={args.jobs} claimers={args.claimers} max_jobs={args.max_jobs} "
        f"submit={args.jobs / submit_s:,.0f} jobs/s drain={done / drain_s:,.0f} jobs/s "
        f"claims={len(latencies)} claim p50={cuts[49] * 1000:.2f} ms "
        f"p99={cuts[98] * 1000:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phase", choices=("none", "keys"), required=True)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--claimers", type=int, default=8)
    parser.add_argument("--max-jobs", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evora-bench-limits-") as directory:
        asyncio.run(_run(args, Path(directory)))


if __name__ == "__main__":
    main()
