"""The PostgreSQL backend's CPU per call of the hot path's operations, under PostgreSQL's
default plans and under the dispatcher's generic ones (db.session_settings).

Not a test: it measures and prints. It starts its own PostgreSQL (default durability,
`synchronous_commit = off` per database to leave the WAL flush out) in a temporary directory,
makes one database per plan mode with the migrations of the `evora` package on the path, and
runs each operation `--calls` times through the job store on a pool of one connection,
reading that connection's backend's user + system CPU from /proc (10 ms ticks: over 2,000
calls, 5 us per call) around them; rounds interleave the modes. Time on a shared machine
varies with the load; a process's own CPU much less. With `--limited`, a concurrency limit on
`tenant:*` exists and each job holds one of TENANTS keys under it, so every claim is the
limited one (evora.claim_limited()): the jobs a timed claim took stay RUNNING until the
completions, so its count of a key's RUNNING holders runs beside up to `--calls` of them.

    python -m bench.backend_cpu --calls 2000 --rounds 3 [--limited]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench import procstats
from evora.embedded import LocalPostgres
from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import Completion, Failure, JobStore
from evora.storage.limits import LimitSpec, LimitStore
from evora.storage.migrate import apply_migrations
from evora.storage.rows import JobDict

MODES = {"auto": False, "force_generic_plan": True}
QUEUE = "q"
# the keys of --limited's jobs, under the one limit (room for all: none is held back)
TENANTS = 100


async def _round(dsn: str, calls: int, generic: bool, limited: bool) -> dict[str, float]:
    """Microseconds of backend CPU per call (per job for batches)."""

    def _submission(n: int) -> JobSubmission:
        keys = [f"tenant:{n % TENANTS}"] if limited else []
        return JobSubmission(queue=QUEUE, type="t", payload={"n": n}, limit_keys=keys)

    pool = await create_pool(dsn, min_size=1, max_size=1, generic_plans=generic)
    store = JobStore(pool)
    pid: int = await pool.fetchval("SELECT pg_backend_pid()")
    per_call: dict[str, float] = {}

    async def timed(name: str, count: int, run: Callable[[], Awaitable[None]]) -> None:
        before = procstats.cpu_seconds(pid)
        await run()
        after = procstats.cpu_seconds(pid)
        assert before is not None and after is not None
        per_call[name] = (after - before) / count * 1e6

    claimed: list[JobDict] = []

    async def submit_each() -> None:
        for n in range(calls):
            await store.submit(_submission(n))

    async def claim_each() -> None:
        for _ in range(calls):
            claimed.extend(await store.claim(worker_id="w", queues=[QUEUE], max_jobs=1))

    async def heartbeat_each() -> None:
        for job in claimed:
            await store.heartbeat(job["id"], job["lease_token"])

    async def complete_each() -> None:
        for job in claimed:
            await store.complete(job["id"], job["lease_token"], {})
        claimed.clear()

    # a failure that ends the job (DLQ): the failure path, without a retry left in the queue
    async def fail_each() -> None:
        for job in claimed:
            await store.fail(Failure(job["id"], job["lease_token"], "boom", retryable=False))
        claimed.clear()

    async def submit_batches() -> None:
        for n in range(0, calls, 100):
            await store.submit_batch([_submission(n + i) for i in range(100)])

    async def claim_batches() -> None:
        for _ in range(0, calls, 100):
            claimed.extend(await store.claim(worker_id="w", queues=[QUEUE], max_jobs=100))

    async def complete_batches() -> None:
        for n in range(0, len(claimed), 100):
            batch = claimed[n : n + 100]
            acks = [Completion(job["id"], job["lease_token"], {}) for job in batch]
            await store.complete_many(acks, with_jobs=False)
        claimed.clear()

    try:
        # each statement prepared on the connection before anything is counted
        await store.submit(_submission(-1))
        [job] = await store.claim(worker_id="w", queues=[QUEUE], max_jobs=1)
        await store.heartbeat(job["id"], job["lease_token"])
        await store.complete(job["id"], job["lease_token"], {})
        await store.submit(_submission(-2))
        [job] = await store.claim(worker_id="w", queues=[QUEUE], max_jobs=1)
        await store.fail(Failure(job["id"], job["lease_token"], "boom", retryable=False))
        await timed("submit 1", calls, submit_each)
        await timed("claim 1", calls, claim_each)
        await timed("heartbeat", calls, heartbeat_each)
        await timed("complete 1", calls, complete_each)
        await submit_each()
        await claim_each()
        await timed("fail 1", calls, fail_each)
        await timed("submit 100, per job", calls, submit_batches)
        await timed("claim 100, per job", calls, claim_batches)
        await timed("complete 100, per job", calls, complete_batches)
    finally:
        await store.close()
        await pool.close()
    return per_call


async def run(args: argparse.Namespace, dsn_of: Callable[[str], str]) -> None:
    dsns = {}
    admin = await create_pool(dsn_of("postgres"), min_size=1, max_size=1)
    try:
        for mode in MODES:
            database = f"backend_cpu_{mode}"
            await admin.execute(f"CREATE DATABASE {database}")
            await admin.execute(f"ALTER DATABASE {database} SET synchronous_commit = off")
            dsns[mode] = dsn_of(database)
            await apply_migrations(dsns[mode])
            if args.limited:
                limits = await create_pool(dsns[mode], min_size=1, max_size=1)
                try:
                    spec = LimitSpec(concurrency=args.calls + 1_000, rate=None)
                    await LimitStore(limits).put("tenant:*", spec)
                finally:
                    await limits.close()
    finally:
        await admin.close()
    for round_ in range(1, args.rounds + 1):
        for mode, generic in MODES.items():
            figures = await _round(dsns[mode], args.calls, generic, args.limited)
            shown = ", ".join(f"{name} {us:,.0f}" for name, us in figures.items())
            print(f"round {round_} {mode:18} us per call: {shown}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=2000, help="calls of each operation")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--limited", action="store_true", help="under a concurrency limit: the limited claim"
    )
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="evora-backend-cpu-") as tmp,
        LocalPostgres(Path(tmp) / "data", durable=True, log_path=Path(tmp) / "pg.log") as pg,
    ):
        asyncio.run(run(args, pg.dsn))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
