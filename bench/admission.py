"""What admission control costs (docs/flow-control.md, "Admission"): the design Evora uses
(lock the key, count its waiting jobs bounded by max_pending + 1, paid by submissions only)
against the alternative of a counter row per key kept in the transaction of every submission
and every way out of PENDING (paid by claims too), on one durable PostgreSQL.

    python -m bench.admission [--jobs 4000] [--producers 8] [--claimers 8] [--depth 1000]

Submissions: `--producers` concurrent connections each submit single jobs with
`evora.submit` (each its own transaction), to a queue with no max_pending, then to one whose
`queue:<q>` has a max_pending with `--depth` jobs already waiting (each admission counts
them, up to max_pending + 1). Prints jobs/s and the p50/p99 of a submission.

Claims: `--claimers` concurrent claimers drain `--jobs` jobs of one queue, 10 per claim, each
claim in a transaction; then the same with the alternative's work added to that transaction:
an UPDATE of the key's counter row (minus the jobs claimed). Prints the drain's jobs/s and
the p50/p99 of a claim: the counter row's lock is held to the claim's commit, so the claimers
of one key queue behind each other's commits.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg

from evora.embedded import LocalPostgres
from evora.storage import queries
from evora.storage.migrate import apply_migrations

SUBMIT = "SELECT evora.submit($1, 'bench.noop', '{\"n\": 1}')"
PRELOAD = """
SELECT evora.submit_batch(jsonb_agg(jsonb_build_object('queue', $1::text, 'type', 'bench.noop')))
FROM generate_series(1, $2::int)
"""
COUNTER_TABLE = "CREATE TABLE bench_pending (key text PRIMARY KEY, n bigint NOT NULL)"
COUNTER_MOVE = "UPDATE bench_pending SET n = n - $2 WHERE key = $1"
CLAIM_BATCH = 10


async def _preload(pool: asyncpg.Pool, queue: str, count: int) -> None:
    for first in range(0, count, 1000):
        await pool.execute(PRELOAD, queue, min(1000, count - first))


def _percentiles(samples: list[float]) -> str:
    cuts = statistics.quantiles(samples, n=100)
    return f"p50 {cuts[49] * 1000:6.2f} ms  p99 {cuts[98] * 1000:6.2f} ms"


async def _loops(
    pool: asyncpg.Pool,
    workers: int,
    calls: int,
    call: Callable[[asyncpg.Connection], Awaitable[int]],
) -> tuple[float, list[float]]:
    """Run `call` from `workers` connections until it has done `calls` units of work; the
    seconds it took and the latency of every call."""
    done = 0
    latencies: list[float] = []

    async def loop() -> None:
        nonlocal done
        async with pool.acquire() as conn:
            while done < calls:
                began = time.perf_counter()
                units = await call(conn)
                latencies.append(time.perf_counter() - began)
                if units == 0:
                    return
                done += units

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(workers)))
    return time.perf_counter() - started, latencies


async def _submissions(pool: asyncpg.Pool, args: argparse.Namespace) -> None:
    await _preload(pool, "limited", args.depth)
    await pool.execute(
        "INSERT INTO evora.flow_limits (key, max_pending) VALUES ('queue:limited', $1)",
        # the producers' last calls may run past --jobs
        args.depth + args.jobs + args.producers,
    )
    await pool.execute("VACUUM ANALYZE evora.jobs")
    for queue in ("free", "limited"):

        async def submit(conn: asyncpg.Connection, queue: str = queue) -> int:
            await conn.fetchval(SUBMIT, queue)
            return 1

        seconds, latencies = await _loops(pool, args.producers, args.jobs, submit)
        what = "no max_pending" if queue == "free" else f"max_pending, {args.depth} waiting"
        print(f"submit  {what:<28} {args.jobs / seconds:8.0f} jobs/s  {_percentiles(latencies)}")


async def _claims(pool: asyncpg.Pool, args: argparse.Namespace) -> None:
    await pool.execute(COUNTER_TABLE)
    for counted in (False, True):
        queue = "counted" if counted else "plain"
        await _preload(pool, queue, args.jobs)
        await pool.execute("INSERT INTO bench_pending VALUES ($1, $2)", f"queue:{queue}", args.jobs)
        await pool.execute("VACUUM ANALYZE evora.jobs")

        async def claim(
            conn: asyncpg.Connection, queue: str = queue, counted: bool = counted
        ) -> int:
            async with conn.transaction():
                rows = await conn.fetch(queries.CLAIM, [queue], None, CLAIM_BATCH, "bench")
                if counted and rows:
                    await conn.execute(COUNTER_MOVE, f"queue:{queue}", len(rows))
            return len(rows)

        seconds, latencies = await _loops(pool, args.claimers, args.jobs, claim)
        what = "counter row per claim" if counted else "no counter (Evora)"
        print(f"claim   {what:<28} {args.jobs / seconds:8.0f} jobs/s  {_percentiles(latencies)}")


async def _run(args: argparse.Namespace, directory: Path) -> None:
    with LocalPostgres(directory / "pg", durable=True) as server:
        dsn = server.dsn()
        await apply_migrations(dsn)
        workers = max(args.producers, args.claimers)
        pool = await asyncpg.create_pool(dsn, min_size=workers, max_size=workers)
        try:
            print(
                f"{args.jobs} jobs; {args.producers} producers, {args.claimers} claimers; "
                "PostgreSQL durable"
            )
            await _submissions(pool, args)
            await _claims(pool, args)
        finally:
            await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--claimers", type=int, default=8)
    parser.add_argument("--depth", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evora-bench-admission-") as directory:
        asyncio.run(_run(args, Path(directory)))


if __name__ == "__main__":
    main()
