"""Token buckets are forgotten (docs/flow-control.md, "What is kept, and for how long"): how
big `evora.flow_buckets` gets under a prefix limit whose producers name a new key per job,
and how small the sweeper's retention pass makes it again, on one durable PostgreSQL.

    python -m bench.flow_buckets [--keys 100000] [--kept 1000] [--rounds 2]

Each round: `--keys` jobs, each holding a key of its own under `tenant:*` (5 a second), and
`--kept` under `hourly:*` (one an hour), all claimed by real limited claims (1,000 a
claim), so every key gets the bucket row its first claim makes; a second later every
`tenant:` bucket is full again, the `hourly:` ones are not. Then the sweeper's retention
pass (`Sweeper.prune_due`, as the leading sweeper runs it once a minute) and a VACUUM (as
autovacuum would). Prints the rows and the table's size (heap, and heap with its primary
key) after the claims, after the pass and after the VACUUM, and how long the pass took;
the next round's keys reuse the space the last one freed, so the size stays that of one
round's keys. A last pass finds nothing to remove among the kept keys: what walking them
costs.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import asyncpg

from evora.embedded import LocalPostgres
from evora.http.metrics import ServiceMetrics
from evora.storage.db import create_pool
from evora.storage.jobs import Completion, JobStore
from evora.storage.limits import LimitSpec, LimitStore, Rate
from evora.storage.migrate import apply_migrations
from evora.storage.retention import PRUNABLE_STATES, RetentionStore
from evora_services.sweeper.metrics import SweeperMetrics
from evora_services.sweeper.sweeper import Retention, Sweeper, Tuning

QUEUE = "tenants"
SUBMIT_BATCH = """
SELECT evora.submit_batch(jsonb_agg(jsonb_build_object(
    'queue', $1::text, 'type', 'bench.noop', 'limit_keys', jsonb_build_array($2::text || n))))
FROM generate_series($3::int, $4::int) AS n
"""
SIZE = """
SELECT count(*) AS rows,
       pg_relation_size('evora.flow_buckets') AS heap,
       pg_total_relation_size('evora.flow_buckets') AS total
FROM evora.flow_buckets
"""


async def _size(pool: asyncpg.Pool, what: str) -> None:
    row = await pool.fetchrow(SIZE)
    assert row is not None
    print(
        f"  {what:<34} {row['rows']:>8} rows  heap {row['heap'] / 2**20:6.2f} MiB"
        f"  with its key {row['total'] / 2**20:6.2f} MiB"
    )


async def _claimed(pool: asyncpg.Pool, store: JobStore, prefix: str, count: int) -> None:
    for first in range(1, count + 1, 1000):
        last = min(first + 999, count)
        await pool.execute(SUBMIT_BATCH, QUEUE, prefix, first, last)
        # every job holds a key of its own: a claim takes them all
        claimed = await store.claim(worker_id="w", queues=[QUEUE], max_jobs=last - first + 1)
        await store.complete_many([Completion(j["id"], j["lease_token"]) for j in claimed])


async def _prune(pool: asyncpg.Pool, sweeper: Sweeper) -> None:
    started = time.perf_counter()
    removed = await sweeper.prune_due()
    seconds = time.perf_counter() - started
    print(f"  retention pass: {removed['flow_buckets']} buckets removed in {seconds:.2f} s")


async def _run(args: argparse.Namespace, directory: Path) -> None:
    with LocalPostgres(directory / "pg", durable=True) as server:
        dsn = server.dsn()
        await apply_migrations(dsn)
        pool = await create_pool(dsn, min_size=2, max_size=2)
        try:
            limits = LimitStore(pool)
            await limits.put("tenant:*", LimitSpec(concurrency=None, rate=Rate(5, 1.0)))
            await limits.put("hourly:*", LimitSpec(concurrency=None, rate=Rate(1, 3600.0)))
            store = JobStore(pool)
            sweeper = Sweeper(
                store,
                RetentionStore(pool),
                SweeperMetrics(ServiceMetrics("sweeper")),
                Retention(jobs=dict.fromkeys(PRUNABLE_STATES, 86_400.0), idempotency_keys=86_400.0),
                Tuning(),
            )
            print(f"PostgreSQL durable; {args.keys} keys under tenant:*, {args.kept} kept")
            for round_ in range(args.rounds):
                print(f"round {round_ + 1}")
                started = time.perf_counter()
                await _claimed(pool, store, f"tenant:{round_}:", args.keys)
                await _claimed(pool, store, f"hourly:{round_}:", args.kept)
                await _size(pool, f"claimed ({time.perf_counter() - started:.1f} s)")
                await asyncio.sleep(1.1)
                await _prune(pool, sweeper)
                await _size(pool, "after the pass")
                await pool.execute("VACUUM evora.flow_buckets")
                await _size(pool, "after VACUUM")
            print("a pass over kept buckets only")
            await _prune(pool, sweeper)
            await store.close()
        finally:
            await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--kept", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evora-bench-flow-buckets-") as directory:
        asyncio.run(_run(args, Path(directory)))


if __name__ == "__main__":
    main()
