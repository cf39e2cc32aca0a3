"""Debounce and throttle keys are forgotten (docs/flow-control.md, "Debounce and throttle"):
how big `evora.submission_keys` gets and how small the sweeper makes it again, and what the
pruning's indexes (migration 0056) cost a submission, on one durable PostgreSQL.

    python -m bench.submission_keys [--keys 100000] [--debounced 20000] [--calls 4000]

Bounded: `--keys` submissions, each with a throttle key of its own and a window of one
second (a producer throttling per user id), and `--debounced` with a debounce key of their
own whose jobs are then claimed; then, the windows passed, the sweeper's retention pass
(`Sweeper.prune_due`, as the leading sweeper runs it once a minute). Prints the rows before
and after, and how long the pass took.

Cost: `--producers` concurrent connections each submit single jobs with `evora.submit` (each
its own transaction), every one with a new throttle key, then every one with a new debounce
key (a key's first submission writes its row, the most a submission pays for a key), on a
table already holding `--keys` rows; with the two indexes of migration 0056 (as shipped) and
without them (as before), alternating, `--rounds` times each, with `synchronous_commit`
off (the commit's flush is the same for both). Prints jobs/s and the p50/p99 of a call.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

from evora.embedded import LocalPostgres
from evora.http.metrics import ServiceMetrics
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations
from evora.storage.retention import PRUNABLE_STATES, RetentionStore
from evora_services.sweeper.metrics import SweeperMetrics
from evora_services.sweeper.sweeper import Retention, Sweeper, Tuning

SUBMIT_BATCH = """
SELECT evora.submit_batch(jsonb_agg(jsonb_build_object(
    'queue', $1::text, 'type', 'bench.noop',
    $2::text, $3::jsonb || jsonb_build_object('key', $4::text || n))))
FROM generate_series($5::int, $6::int) AS n
"""
SUBMIT = "SELECT evora.submit($1, 'bench.noop', '{}', $2::jsonb)"
THROTTLE: dict[str, float] = {"window_seconds": 1}
DEBOUNCE: dict[str, float] = {"delay_seconds": 0, "max_delay_seconds": 3600}
INDEXES = {
    "submission_keys_throttle_until": "(until) WHERE kind = 'throttle'",
    "submission_keys_debounce_since": "(since) WHERE kind = 'debounce'",
}


async def _rows(pool: asyncpg.Pool) -> int:
    count: int = await pool.fetchval("SELECT count(*) FROM evora.submission_keys")
    return count


async def _fill(pool: asyncpg.Pool, queue: str, kind: str, count: int, prefix: str) -> None:
    options = THROTTLE if kind == "throttle" else DEBOUNCE
    for first in range(1, count + 1, 1000):
        last = min(first + 999, count)
        await pool.execute(SUBMIT_BATCH, queue, kind, options, prefix, first, last)


async def _bounded(pool: asyncpg.Pool, args: argparse.Namespace) -> None:
    started = time.perf_counter()
    await _fill(pool, "throttled", "throttle", args.keys, "user:")
    await _fill(pool, "debounced", "debounce", args.debounced, "doc:")
    made = time.perf_counter() - started
    store = JobStore(pool)
    claimed = 0
    while claimed < args.debounced:
        claimed += len(await store.claim(worker_id="w", queues=["debounced"], max_jobs=1000))
    before = await _rows(pool)
    print(
        f"keys    {args.keys} throttle (1 s window) + {args.debounced} debounce (jobs claimed):"
        f" {before} rows, made in {made:.1f} s"
    )
    await asyncio.sleep(1.1)
    sweeper = Sweeper(
        store,
        RetentionStore(pool),
        SweeperMetrics(ServiceMetrics("sweeper")),
        Retention(jobs=dict.fromkeys(PRUNABLE_STATES, 86_400.0), idempotency_keys=86_400.0),
        Tuning(),
    )
    started = time.perf_counter()
    removed = await sweeper.prune_due()
    seconds = time.perf_counter() - started
    print(
        f"prune   one retention pass: {removed['submission_keys']} keys removed in"
        f" {seconds:.2f} s; {await _rows(pool)} rows left"
    )


def _percentiles(samples: list[float]) -> str:
    cuts = statistics.quantiles(samples, n=100)
    return f"p50 {cuts[49] * 1000:6.2f} ms  p99 {cuts[98] * 1000:6.2f} ms"


async def _cost(pool: asyncpg.Pool, args: argparse.Namespace) -> None:
    # a table the size a producer keeps within its windows
    await _fill(pool, "kept", "throttle", args.keys, "kept:")
    await pool.execute("UPDATE evora.submission_keys SET until = until + interval '1 day'")
    await pool.execute("VACUUM ANALYZE evora.submission_keys")
    for round_ in range(args.rounds):
        # alternating which goes first, so a drift of the machine's load favours neither
        for indexed in (False, True) if round_ % 2 == 0 else (True, False):
            if indexed:
                for name, definition in INDEXES.items():
                    await pool.execute(
                        f"CREATE INDEX IF NOT EXISTS {name} ON evora.submission_keys {definition}"
                    )
            else:
                for name in INDEXES:
                    await pool.execute(f"DROP INDEX IF EXISTS evora.{name}")
            for kind, options in (("throttle", THROTTLE), ("debounce", DEBOUNCE)):
                seconds, latencies = await _submissions(pool, args, kind, options)
                what = "with 0056's indexes" if indexed else "without them"
                print(
                    f"submit  round {round_ + 1} {kind:<8} new key each, {what:<20}"
                    f" {args.calls / seconds:7.0f} jobs/s  {_percentiles(latencies)}"
                )


async def _submissions(
    pool: asyncpg.Pool, args: argparse.Namespace, kind: str, options: dict[str, float]
) -> tuple[float, list[float]]:
    """`args.calls` single submissions from `args.producers` connections, each with a key of
    its own: the seconds they took and the latency of each."""
    latencies: list[float] = []
    left = args.calls

    async def loop() -> None:
        nonlocal left
        async with pool.acquire() as conn:
            # The commit's flush is the same with or without the indexes and, on a shared
            # disk, larger and noisier than what is compared: left out (the pool resets it).
            await conn.execute("SET synchronous_commit = off")
            while left > 0:
                left -= 1
                key = {kind: {**options, "key": str(uuid.uuid4())}}
                began = time.perf_counter()
                await conn.fetchval(SUBMIT, "cost", key)
                latencies.append(time.perf_counter() - began)

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(args.producers)))
    return time.perf_counter() - started, latencies


async def _run(args: argparse.Namespace, directory: Path) -> None:
    with LocalPostgres(directory / "pg", durable=True) as server:
        dsn = server.dsn()
        await apply_migrations(dsn)
        pool = await create_pool(dsn, min_size=args.producers, max_size=args.producers)
        try:
            print(f"PostgreSQL durable; {args.producers} producers")
            await _bounded(pool, args)
            await _cost(pool, args)
        finally:
            await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--debounced", type=int, default=20_000)
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evora-bench-submission-keys-") as directory:
        asyncio.run(_run(args, Path(directory)))


if __name__ == "__main__":
    main()
