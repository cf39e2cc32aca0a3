"""What cancelling a job that waits for its children costs (docs/jobs-that-wait.md,
"Cancelling a waiting job"): the job and every child its spawn made are cancelled in one
transaction, the children in one statement, on one durable PostgreSQL.

    python -m bench.cancel_fanout [--children 100 1000 10000] [--what-if SQL] [--analyze]
                                  [--chained]

For each size: a running job spawns that many children (`JobStore.spawn_children`), then is
cancelled (`JobStore.cancel`); prints the seconds the cancel took and how many children it
left not CANCELLED (0 expected). Each child is a dependency of the job, so the statement that
cancels them notes every one for the settlement (functions/dependencies.sql). `--what-if` SQL
runs after the migrations: another way of noting them, say (a function file's text).
`--analyze` analyses the tables before each cancel, as autovacuum soon has them after a spawn
(their statistics choose the plan of the tree of children the cancel reads). `--chained`: each
child after the first waits for the one before it (a spawn of a chain of steps), so the tree's
read checks each child a sibling waits for against the family. A cancel the statement timeout
ends is printed as such.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import asyncpg

from evora.embedded import LocalPostgres
from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations


def _children(queue: str, size: int, chained: bool) -> list[JobSubmission]:
    return [
        JobSubmission(
            queue=queue,
            type="c",
            ref=f"c{k}" if chained else None,
            depends_on=[f"ref:c{k - 1}"] if chained and k else [],
        )
        for k in range(size)
    ]


async def _run(
    sizes: list[int], what_if: str | None, analyze: bool, chained: bool, directory: Path
) -> None:
    with LocalPostgres(directory / "pg", durable=True) as server:
        dsn = server.dsn()
        await apply_migrations(dsn)
        if what_if:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(what_if)
            finally:
                await conn.close()
        pool = await create_pool(dsn, min_size=2, max_size=4)
        try:
            store = JobStore(pool)
            print("PostgreSQL durable" + (", chained children" if chained else ""))
            for size in sizes:
                parents, kids = f"parents-{size}", f"children-{size}"
                await store.submit(JobSubmission(queue=parents, type="p"))
                [parent] = await store.claim(worker_id="w", queues=[parents])
                children = _children(kids, size, chained)
                await store.spawn_children(parent["id"], parent["lease_token"], children)
                if analyze:
                    await pool.execute("ANALYZE")
                started = time.perf_counter()
                try:
                    cancelled = await store.cancel(parent["id"])
                except asyncpg.QueryCanceledError:
                    seconds = time.perf_counter() - started
                    print(
                        f"cancel  a job waiting for {size:>6} children: cancelled by the"
                        f" statement timeout after {seconds:.2f} s"
                    )
                    continue
                seconds = time.perf_counter() - started
                left = await pool.fetchval(
                    "SELECT count(*) FROM evora.jobs WHERE queue = $1 AND state <> 'CANCELLED'",
                    kids,
                )
                print(
                    f"cancel  a job waiting for {size:>6} children: {seconds:6.2f} s;"
                    f" job {cancelled.job['state']}, {left} children not CANCELLED"
                )
        finally:
            await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--children", type=int, nargs="+", default=[100, 1000, 10_000])
    parser.add_argument("--what-if", help="SQL run after the migrations")
    parser.add_argument("--analyze", action="store_true", help="ANALYZE before each cancel")
    parser.add_argument(
        "--chained", action="store_true", help="each child waits for the one before it"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="evora-bench-cancel-fanout-") as directory:
        asyncio.run(_run(args.children, args.what_if, args.analyze, args.chained, Path(directory)))


if __name__ == "__main__":
    main()
