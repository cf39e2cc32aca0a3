"""What migration 0065 (a CHECK that every array of an `event_batches` row holds one element
per event) costs on a large history of batches, and whether writers wait for it.

Not a test: it measures and prints. It starts its own PostgreSQL 18 (`LocalPostgres`,
durable), migrates a database to the newest version, then takes 0065 back out (drops the
constraint, forgets the record): the schema of 0064 with this release's function files, as
an upgrade finds it. It loads `--events` events as rows of `evora.event_batches` of
`--batch` events each (every array as the writers fill it, a real job's image in each),
VACUUM ANALYZEs, then times the constraint's validation alone (rolled back) and `evora
migrate` as shipped (0065 and the function files). Meanwhile a writer inserts one batch row
every `--write-every` seconds, each in a transaction of its own; its slowest insert says how
long a writer waited on the migration's locks.

    python -m bench.batches_shape_migration                   # 10,000,000 events
    python -m bench.batches_shape_migration --events 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import asyncpg

from bench.group_index_migration import timed_alone
from evora.embedded import LocalPostgres
from evora.storage.migrate import apply_migrations

VERSION = 65
CONSTRAINT = "event_batches_shape"

# $1 batch rows, $2 events each: arrays as the writers make them, one job's image repeated
LOAD = """
INSERT INTO evora.event_batches (seqs, at, job_ids, job_versions, queues, types, events,
                                 from_states, to_states, attempts, worker_ids, data, jobs)
SELECT evora.next_seqs($2), evora.clock_now(),
       array_fill(j.id, ARRAY[$2::int]), array_fill(2, ARRAY[$2::int]),
       array_fill(j.queue, ARRAY[$2::int]),
       array_fill(j.type, ARRAY[$2::int]), array_fill('claimed'::text, ARRAY[$2::int]),
       array_fill('PENDING'::evora.job_state, ARRAY[$2::int]),
       array_fill('RUNNING'::evora.job_state, ARRAY[$2::int]), array_fill(1, ARRAY[$2::int]),
       array_fill('w'::text, ARRAY[$2::int]), NULL,
       array_fill(evora.event_image(j, 'PENDING'), ARRAY[$2::int])
FROM generate_series(1, $1), (SELECT * FROM evora.jobs LIMIT 1) AS j
"""

VALIDATE = f"""
ALTER TABLE evora.event_batches ADD CONSTRAINT {CONSTRAINT} CHECK (
    cardinality(job_ids) = cardinality(seqs) AND cardinality(jobs) = cardinality(seqs)
) NOT VALID;
ALTER TABLE evora.event_batches VALIDATE CONSTRAINT {CONSTRAINT};
"""


async def batch_writer(dsn: str, every: float, stop: asyncio.Event) -> list[float]:
    """Seconds each insert of one batch row of 100 events took, one every `every` seconds,
    each in a transaction of its own, until `stop`."""
    conn = await asyncpg.connect(dsn)
    took = []
    try:
        while not stop.is_set():
            started = time.perf_counter()
            await conn.execute(LOAD, 1, 100)
            took.append(time.perf_counter() - started)
            await asyncio.sleep(every)
    finally:
        await conn.close()
    return took


async def run(args: argparse.Namespace, dsn: str) -> None:
    await apply_migrations(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"ALTER TABLE evora.event_batches DROP CONSTRAINT {CONSTRAINT}")
        await conn.execute("DELETE FROM evora.migrations WHERE version = $1", VERSION)
        await conn.execute("SELECT evora.submit('q', 't')")
        rows = args.events // args.batch
        started = time.perf_counter()
        for first in range(0, rows, 1_000):
            await conn.execute(LOAD, min(1_000, rows - first), args.batch)
        print(
            f"loaded {rows:,} batch rows of {args.batch} events in "
            f"{time.perf_counter() - started:.1f} s"
        )
        await conn.execute("VACUUM ANALYZE evora.event_batches")
        size = await conn.fetchval(
            "SELECT pg_size_pretty(sum(pg_total_relation_size(inhrelid))) FROM pg_inherits"
            " WHERE inhparent = 'evora.event_batches'::regclass"
        )
        print(f"event_batches: {size} with indexes and TOAST")
        print(f"  add NOT VALID and validate, alone: {await timed_alone(conn, VALIDATE):.2f} s")
    finally:
        await conn.close()
    await migrate_beside_a_writer(dsn, args.write_every)


async def migrate_beside_a_writer(dsn: str, every: float) -> None:
    """`evora migrate` as shipped while batch_writer() inserts a batch row every `every`
    seconds (from a second before it to a second after): how long the migration took, and
    the writer's median and slowest insert meanwhile."""
    stop = asyncio.Event()
    writer = asyncio.create_task(batch_writer(dsn, every, stop))
    await asyncio.sleep(1)
    started = time.perf_counter()
    applied = await apply_migrations(dsn)
    took = time.perf_counter() - started
    await asyncio.sleep(1)
    stop.set()
    inserts = await writer
    print(f"evora migrate {applied}: {took:.2f} s (what it builds after its transaction too)")
    print(
        f"  a writer's {len(inserts)} inserts meanwhile: median "
        f"{sorted(inserts)[len(inserts) // 2] * 1000:.1f} ms, slowest {max(inserts) * 1000:.1f} ms"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--batch", type=int, default=100, help="events per batch row")
    parser.add_argument("--write-every", type=float, default=0.05, help="the writer's pause, s")
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="evora-batches-shape-") as tmp,
        LocalPostgres(Path(tmp) / "data", log_path=Path(tmp) / "postgres.log") as pg,
    ):
        asyncio.run(run(args, pg.dsn("postgres")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
