"""What the auditor (evora.storage.audit, docs/audit.md) costs: the time of one audit over
the newest 10k events and over the whole history of about 100k events, on a history the
system's own statements wrote.

Not a test: it measures and prints. It starts its own PostgreSQL, applies the migrations and
writes the history through `JobStore` (batch submits, claims of 100, completions and some
failures, a third of the jobs in FIFO groups, some with limit keys, under a concurrency
limit so the limit checks have claims to replay; first, a fifth of the events in a fair queue
of 20 fairness keys, claimed before the limit exists, so the fair claims are tagged and
`fair_virtual_time` has claims to replay), then times `audit()` over windows of the
newest N events (`from_seq`), each `--rounds` times, and prints the median seconds and
microseconds per event.

    python -m bench.audit --events 100000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import asyncpg

from evora.embedded import LocalPostgres
from evora.protocol.jobs import JobSubmission
from evora.storage.audit import audit
from evora.storage.db import create_pool
from evora.storage.jobs import Completion, Failure, JobStore
from evora.storage.migrate import apply_migrations

QUEUE = "bench"
FAIR_QUEUE = "bench-fair"


async def write_history(dsn: str, events: int) -> int:
    """About `events` events (three per job: submitted, claimed, completed; a failed
    attempt adds two); returns how many there are."""
    pool = await create_pool(dsn, min_size=1, max_size=4)
    store = JobStore(pool)
    try:
        # the fair claim serves a fair queue only while no concurrency or rate limit exists
        while (await pool.fetchval("SELECT count(*) FROM evora.job_events")) < events // 5:
            await store.submit_batch(
                [
                    JobSubmission(queue=FAIR_QUEUE, type="t", fairness_key=f"tenant:{i % 20}")
                    for i in range(500)
                ]
            )
            while claimed := await store.claim(worker_id="w", queues=[FAIR_QUEUE], max_jobs=100):
                await store.complete_many(
                    [Completion(j["id"], j["lease_token"], None) for j in claimed]
                )
        await pool.execute(
            "INSERT INTO evora.flow_limits (key, concurrency) VALUES ('tenant:*', 1000)"
        )
        n = 0
        while (await pool.fetchval("SELECT count(*) FROM evora.job_events")) < events:
            await store.submit_batch(
                [
                    JobSubmission(
                        queue=QUEUE,
                        type="t",
                        group_key=f"g{(n + i) % 50}" if (n + i) % 3 == 0 else None,
                        limit_keys=[f"tenant:{(n + i) % 20}"] if (n + i) % 4 == 0 else [],
                        max_attempts=3,
                    )
                    for i in range(500)
                ]
            )
            n += 500
            while claimed := await store.claim(worker_id="w", queues=[QUEUE], max_jobs=100):
                fails = [j for j in claimed if j["id"].int % 10 == 0 and j["attempt"] == 1]
                if fails:
                    await store.fail_many(
                        [Failure(j["id"], j["lease_token"], "x", retry_in_seconds=0) for j in fails]
                    )
                await store.complete_many(
                    [Completion(j["id"], j["lease_token"], None) for j in claimed if j not in fails]
                )
        total: int = await pool.fetchval("SELECT count(*) FROM evora.job_events")
        await pool.execute("VACUUM ANALYZE")
        return total
    finally:
        await store.close()
        await pool.close()


async def run(dsn: str, events: int, rounds: int, windows: Sequence[int]) -> None:
    await apply_migrations(dsn)
    t0 = time.perf_counter()
    total = await write_history(dsn, events)
    print(f"history: {total} events written in {time.perf_counter() - t0:.0f} s")
    conn = await asyncpg.connect(dsn)
    try:
        last: int = await conn.fetchval("SELECT evora.last_event_seq()")
        for window in (*windows, total):
            from_seq = max(1, last - window + 1)
            times = []
            for _ in range(rounds):
                started = time.perf_counter()
                report = await audit(conn, from_seq=from_seq)
                times.append(time.perf_counter() - started)
                assert report.ok, report.text()
            median = statistics.median(times)
            print(
                f"window of {report.events:>7} events ({report.jobs:>6} jobs): "
                f"median {median:.3f} s over {rounds} runs, "
                f"{median / report.events * 1e6:.1f} us per event"
            )
    finally:
        await conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="evora-bench-audit-") as tmp,
        LocalPostgres(Path(tmp) / "data", durable=False) as pg,
    ):
        asyncio.run(run(pg.dsn("postgres"), args.events, args.rounds, (10_000,)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
