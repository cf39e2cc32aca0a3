"""What migration 0032 (job_events partitioned by time) costs on a large history.

Not a test: it measures and prints. It starts its own PostgreSQL 18 (`LocalPostgres`,
durable), migrates a database to 0031, fills job_events with `--rows` events (one
INSERT ... SELECT from generate_series, each a copy of one real `submitted` event with its
own job id, dated over the last `--days` days), VACUUM ANALYZEs, then times:

- `evora migrate` to 0032 as shipped: the old table attached as the first partition after a
  CHECK constraint proves its range (one sequential scan), the tail index taken over, the two
  unique indexes built anew (a partitioned unique index must hold `at`);
- for comparison, what copying would cost at least: `INSERT INTO` a fresh partitioned
  table (same indexes) `SELECT *` from the old one, on a second database filled the same way.

    python -m bench.events_partition_migration               # 1,000,000 events
    python -m bench.events_partition_migration --rows 100000
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import asyncpg

from evora.embedded import LocalPostgres
from evora.storage.migrate import apply_migrations

BEFORE = 31

FILL = """
INSERT INTO evora.job_events (job_id, job_version, queue, type, event, from_state, to_state,
                              attempt, worker_id, at, data, job)
SELECT gen_random_uuid(), 1, e.queue, e.type, e.event, e.from_state, e.to_state, e.attempt,
       NULL, now() - make_interval(secs => $2 * 86400.0 * i / $1), e.data, e.job
FROM generate_series(1, $1) i, (SELECT * FROM evora.job_events LIMIT 1) e
"""

COPY = """
CREATE TABLE evora.job_events_copy (LIKE evora.job_events INCLUDING DEFAULTS)
    PARTITION BY RANGE (at);
ALTER TABLE evora.job_events_copy ADD PRIMARY KEY (seq, at);
ALTER TABLE evora.job_events_copy ADD UNIQUE (job_id, job_version, at);
CREATE INDEX ON evora.job_events_copy (xid, seq);
CREATE TABLE evora.job_events_copy_all PARTITION OF evora.job_events_copy
    FOR VALUES FROM (MINVALUE) TO (MAXVALUE);
INSERT INTO evora.job_events_copy SELECT * FROM evora.job_events;
"""


REPO = Path(__file__).resolve().parents[1]
BEFORE_PARTITIONS = "f21e66e"  # main with migration 0031 its newest
FILES = "shared/evora/storage/functions"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout


def _files_before_0032() -> list[str]:
    names = _git("ls-tree", "--name-only", f"{BEFORE_PARTITIONS}:{FILES}").split()
    return [
        _git("show", f"{BEFORE_PARTITIONS}:{FILES}/{n}")
        for n in sorted(names)
        if n.endswith(".sql")
    ]


async def filled(admin: asyncpg.Connection, url: str, name: str, rows: int, days: float) -> str:
    await admin.execute(f'CREATE DATABASE "{name}"')
    dsn = url.rsplit("/", 1)[0] + f"/{name}"
    await apply_migrations(dsn, upto=BEFORE)
    conn = await asyncpg.connect(dsn)
    try:
        # the function files of the release whose newest migration was 0031
        for text in _files_before_0032():
            await conn.execute(text)
        await conn.execute("SELECT evora.submit('bench', 'bench.t')")
        started = time.perf_counter()
        await conn.execute(FILL, rows - 1, days)
        print(f"  {name}: filled {rows} events in {time.perf_counter() - started:.1f} s")
        await conn.execute("VACUUM ANALYZE evora.job_events")
        size = await conn.fetchval(
            "SELECT pg_size_pretty(pg_total_relation_size('evora.job_events'))"
        )
        print(f"  {name}: job_events {size} with its indexes")
    finally:
        await conn.close()
    return dsn


async def measure(url: str, rows: int, days: float) -> None:
    admin = await asyncpg.connect(url)
    try:
        migrated = await filled(admin, url, "evora_migrated", rows, days)
        copied = await filled(admin, url, "evora_copied", rows, days)
    finally:
        await admin.close()
    await asyncio.sleep(1)
    started = time.perf_counter()
    assert await apply_migrations(migrated, upto=32) == [32]
    attach = time.perf_counter() - started
    conn = await asyncpg.connect(copied)
    try:
        started = time.perf_counter()
        async with conn.transaction():
            await conn.execute(COPY)
        copy = time.perf_counter() - started
    finally:
        await conn.close()
    print(f"\n{rows} events:")
    print(f"  migration 0032 (attach the old table, build the two unique indexes): {attach:.1f} s")
    print(f"  copying them into a partitioned table with the same indexes:          {copy:.1f} s")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.events_partition_migration")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=30.0)
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="evora-0032-") as tmp,
        LocalPostgres(Path(tmp) / "data", durable=True) as pg,
    ):
        asyncio.run(measure(pg.dsn("postgres"), args.rows, args.days))


if __name__ == "__main__":
    main()
