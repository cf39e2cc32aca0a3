"""What migration 0066 (a job's timeline found through the milliseconds its batch's jobs were
created in) costs an upgrade on a large history of batches, whether writers wait for it, and
what a job's timeline costs to read before and after.

Not a test: it measures and prints. It starts its own PostgreSQL 18 (`LocalPostgres`,
durable), migrates a database to the newest version, then takes 0066 back out (its index, its
table, its record; the GIN index of the batches' job ids made again): the schema of 0065 with
this release's function files, as an upgrade finds it. It loads `--events` events as rows of
`evora.event_batches` of `--batch` events each, three events per job (a job's submission, its
claim and its completion in three batches), the job ids UUIDv7s of which `--per-ms` share a
millisecond (as a submission of that many jobs makes them); VACUUM ANALYZEs; reads the
timelines of `--reads` random jobs (`evora.events_of_job()`, through the old index); runs
`evora migrate` as shipped while a writer inserts a batch row every `--write-every` seconds
(its slowest insert says how long a writer waited for the upgrade: the large partition's
index is built CONCURRENTLY after the migration's transaction); and reads the same timelines
again, through the new index.

    python -m bench.timeline_index_migration                   # 3,000,000 events
    python -m bench.timeline_index_migration --events 300000 --per-ms 1000
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from uuid import UUID

import asyncpg

from bench.batches_shape_migration import migrate_beside_a_writer
from evora.embedded import LocalPostgres
from evora.storage.migrate import apply_migrations

VERSION = 66

TAKE_BACK = """
DROP INDEX evora.event_batches_job_times;
DROP TABLE evora.retiring_indexes;
DELETE FROM evora.migrations WHERE version = 66;
"""
OLD_INDEX = "CREATE INDEX event_batches_jobs ON evora.event_batches USING gin (job_ids)"

# $1 the first batch row, $2 batch rows, $3 events each, $4 jobs in all, $5 jobs per
# millisecond, $6 the first millisecond: event g is of job g mod $4 (each job's three events
# in three batches), whose id is a UUIDv7 of millisecond $6 + job / $5, random otherwise (the
# same random bits for a job's three events: seeded by the job's number)
LOAD = """
INSERT INTO evora.event_batches (seqs, at, job_ids, job_versions, queues, types, events,
                                 from_states, to_states, attempts, worker_ids, data, jobs)
SELECT evora.next_seqs($3), evora.clock_now(), ids.ids,
       array_fill(1, ARRAY[$3::int]), array_fill('q'::text, ARRAY[$3::int]),
       array_fill('t'::text, ARRAY[$3::int]), array_fill('claimed'::text, ARRAY[$3::int]),
       array_fill('PENDING'::evora.job_state, ARRAY[$3::int]),
       array_fill('RUNNING'::evora.job_state, ARRAY[$3::int]), array_fill(1, ARRAY[$3::int]),
       array_fill('w'::text, ARRAY[$3::int]), NULL,
       array_fill(NULL::evora.job_image, ARRAY[$3::int])
FROM generate_series($1::bigint, $1::bigint + $2 - 1) AS b
CROSS JOIN LATERAL (
    SELECT array_agg(pg_temp.bench_job_id(((b * $3 + i) % $4), $5, $6) ORDER BY i) AS ids
    FROM generate_series(0, $3 - 1) AS i
) ids
"""

JOB_ID = """
CREATE FUNCTION pg_temp.bench_job_id(job bigint, per_ms integer, first_ms bigint)
RETURNS uuid LANGUAGE sql IMMUTABLE AS $$
    SELECT encode(overlay(decode(md5(job::text), 'hex')
                          PLACING substring(int8send(first_ms + job / per_ms) FROM 3)
                          FROM 1 FOR 6), 'hex')::uuid
$$
"""

SIZES = """
SELECT pg_size_pretty(sum(pg_total_relation_size(inhrelid))) FROM pg_inherits
WHERE inhparent = 'evora.event_batches'::regclass
"""

INDEX_SIZE = """
SELECT pg_size_pretty(sum(pg_relation_size(h.inhrelid))) FROM pg_inherits h
WHERE h.inhparent = to_regclass($1)
"""


async def _timelines(conn: asyncpg.Connection, ids: list[UUID]) -> str:
    """The timelines of `ids` read one by one: the median and the slowest read, and how many
    events they held."""
    took, events = [], 0
    for job_id in ids:
        started = time.perf_counter()
        events += len(await conn.fetch("SELECT * FROM evora.events_of_job($1)", job_id))
        took.append(time.perf_counter() - started)
    took.sort()
    return (
        f"{len(ids)} timelines ({events} events): median {took[len(took) // 2] * 1000:.2f} ms, "
        f"slowest {took[-1] * 1000:.2f} ms"
    )


async def run(args: argparse.Namespace, dsn: str) -> None:
    await apply_migrations(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(TAKE_BACK)
        await conn.execute("SELECT evora.submit('q', 't')")  # the writer's job image
        await conn.execute(JOB_ID)
        jobs = args.events // 3
        rows = args.events // args.batch
        first_ms = int(time.time() * 1000) - 86_400_000
        started = time.perf_counter()
        for first in range(0, rows, 1_000):
            await conn.execute(
                LOAD, first, min(1_000, rows - first), args.batch, jobs, args.per_ms, first_ms
            )
        print(
            f"loaded {rows:,} batch rows of {args.batch} events ({jobs:,} jobs, {args.per_ms} "
            f"a millisecond) in {time.perf_counter() - started:.1f} s"
        )
        started = time.perf_counter()
        await conn.execute(OLD_INDEX)
        print(f"the old index built in {time.perf_counter() - started:.1f} s")
        await conn.execute("VACUUM ANALYZE evora.event_batches")
        print(f"event_batches: {await conn.fetchval(SIZES)} with indexes and TOAST")
        print(f"  the old index: {await conn.fetchval(INDEX_SIZE, 'evora.event_batches_jobs')}")
        rng = random.Random(1)
        ids = [
            await conn.fetchval("SELECT pg_temp.bench_job_id($1, $2, $3)", n, args.per_ms, first_ms)
            for n in rng.sample(range(jobs), args.reads)
        ]
        await _timelines(conn, ids[:10])  # warm the cache as the second read finds it
        print(f"  before, through the old index: {await _timelines(conn, ids)}")
    finally:
        await conn.close()
    await migrate_beside_a_writer(dsn, args.write_every)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("VACUUM ANALYZE evora.event_batches")
        print(
            f"  the new index: {await conn.fetchval(INDEX_SIZE, 'evora.event_batches_job_times')}"
        )
        await _timelines(conn, ids[:10])
        print(f"  after, through the new index: {await _timelines(conn, ids)}")
    finally:
        await conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=3_000_000)
    parser.add_argument("--batch", type=int, default=100, help="events per batch row")
    parser.add_argument("--per-ms", type=int, default=100, help="jobs created per millisecond")
    parser.add_argument("--reads", type=int, default=200, help="timelines read, before and after")
    parser.add_argument("--write-every", type=float, default=0.05, help="the writer's pause, s")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("evora.embedded").setLevel(logging.WARNING)
    with (
        tempfile.TemporaryDirectory(prefix="evora-timeline-index-") as tmp,
        LocalPostgres(Path(tmp) / "data", log_path=Path(tmp) / "postgres.log") as pg,
    ):
        asyncio.run(run(args, pg.dsn("postgres")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
