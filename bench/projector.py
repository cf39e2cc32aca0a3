"""Projector benchmark: catch-up throughput (events/s), MongoDB writes per event, and lag
while a steady workload runs.

    python -m bench.projector            # 20,000 jobs backlog, 30 s live phase
    python -m bench.projector --quick
    python -m bench.projector --queues 200   # a batch touches ~200 queue documents

Starts its own durable PostgreSQL (embedded wheel) and MongoDB-wire server (secantusd-py),
both in a temp dir. The local MongoDB-wire server is far slower than a real MongoDB (it is
CPU-bound Python, ~3k upserts/s); the writes-per-event figure carries over, the events/s
does not.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import asyncpg

from evora.embedded import LocalMongo, LocalPostgres
from evora.http.metrics import ServiceMetrics
from evora.protocol.jobs import JobSubmission
from evora.readmodels.client import mongo_client
from evora.storage.db import create_pool
from evora.storage.jobs import Completion, JobStore
from evora.storage.migrate import apply_migrations
from evora_services.projector.metrics import ProjectorMetrics
from evora_services.projector.projector import Projector


async def cycle(store: JobStore, jobs: int, queues: list[str], batch: int = 500) -> None:
    """Submit, claim and complete `jobs` jobs in batches, spread over `queues`: three events
    per job."""
    for start in range(0, jobs, batch):
        n = min(batch, jobs - start)
        await store.submit_batch(
            [JobSubmission(queue=queues[(start + i) % len(queues)], type="t") for i in range(n)]
        )
        claimed = await store.claim(worker_id=f"w{start % 7}", queues=queues, max_jobs=n)
        await store.complete_many([Completion(j["id"], j["lease_token"]) for j in claimed])


def writes(metrics: ProjectorMetrics) -> float:
    total = 0.0
    for metric in metrics.writes.collect():
        total += sum(s.value for s in metric.samples if s.name.endswith("_total"))
    return total


async def main(args: argparse.Namespace) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="evora-bench-proj-") as tmp,
        LocalPostgres(Path(tmp) / "pg") as pg,
        LocalMongo(Path(tmp) / "mongo") as mongo_server,
    ):
        dsn = pg.dsn()
        await apply_migrations(dsn)
        pool = await create_pool(dsn, max_size=8)
        client = mongo_client(mongo_server.url, "bench")
        db = client["bench"]
        store = JobStore(pool)
        queues = [f"q{n}" for n in range(args.queues)]
        print(f"machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}")
        print(
            f"PostgreSQL {await pool.fetchval('SHOW server_version')} (durable), "
            f"MongoDB-wire: secantusd-py"
        )

        started = time.perf_counter()
        await cycle(store, args.jobs, queues)
        events = await pool.fetchval("SELECT count(*) FROM evora.job_events")
        print(
            f"backlog: {args.jobs} jobs in {args.queues} queues, {events} events in "
            f"{time.perf_counter() - started:.1f} s"
        )

        metrics = ProjectorMetrics(ServiceMetrics("bench"))
        projector = Projector(pool, db, 1, metrics)
        started = time.perf_counter()
        cpu = time.process_time()  # this process: the projector (servers run apart)
        applied = 0
        while batch := await projector.run_once():
            applied += batch
        took = time.perf_counter() - started
        cpu = time.process_time() - cpu
        print(
            f"catch-up: {applied} events in {took:.1f} s = {applied / took:,.0f} events/s; "
            f"{writes(metrics) / applied:.3f} MongoDB writes per event; "
            f"projector CPU {cpu / applied * 1e6:.1f} us per event"
        )

        lags_events: list[int] = []
        lags_seconds: list[float] = []
        stop = asyncio.Event()

        async def project() -> None:
            while not stop.is_set():
                if not await projector.run_once():
                    await asyncio.sleep(0.05)

        async def sample(conn: asyncpg.Pool) -> None:
            while not stop.is_set():
                checkpoint = await projector.checkpoint()
                newest = await conn.fetchval("SELECT evora.last_event_seq()")
                # the events past the checkpoint, through the BRIN indexes on seq of both
                # tables: through the view a filter on seq reaches no index of the batches
                # (migration 0064) and would unfold every batch
                oldest = await conn.fetchval(
                    "SELECT extract(epoch FROM now() - min(at))"
                    " FROM evora.events_between($1::int8 + 1, $2::int8 + 1)",
                    checkpoint.get("max_seq", 0),
                    newest,
                )
                lags_events.append(int(newest) - int(checkpoint.get("max_seq", 0)))
                lags_seconds.append(float(oldest or 0.0))
                await asyncio.sleep(0.5)

        async def load() -> int:
            done = 0
            deadline = time.monotonic() + args.seconds
            while time.monotonic() < deadline:
                tick = time.monotonic()
                await cycle(store, args.rate // 2, queues, batch=args.rate // 2)
                done += args.rate // 2
                await asyncio.sleep(max(0.0, 0.5 - (time.monotonic() - tick)))
            return done

        before_events = metrics.events._value.get()
        before_writes = writes(metrics)
        tasks = [asyncio.create_task(project()), asyncio.create_task(sample(pool))]
        offered = await load()
        newest = await pool.fetchval("SELECT evora.last_event_seq()")
        while True:  # let the projector drain what the load left
            if (await projector.checkpoint()).get("max_seq") == newest:
                break
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*tasks)
        live_events = metrics.events._value.get() - before_events
        print(
            f"live: {offered} jobs at ~{args.rate} jobs/s for {args.seconds} s "
            f"({live_events:.0f} events); writes/event "
            f"{(writes(metrics) - before_writes) / live_events:.3f}"
        )
        print(
            f"lag (events): p50 {statistics.median(lags_events):.0f}, "
            f"max {max(lags_events)}; lag (seconds behind oldest unapplied): "
            f"p50 {statistics.median(lags_seconds):.2f}, max {max(lags_seconds):.2f}"
        )
        await client.close()
        await pool.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rate", type=int, default=400, help="jobs/s in the live phase")
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--queues", type=int, default=4, help="queues the jobs are spread over")
    parser.add_argument("--quick", action="store_true")
    arguments = parser.parse_args()
    if arguments.quick:
        arguments.jobs, arguments.seconds = 2000, 5
    asyncio.run(main(arguments))
