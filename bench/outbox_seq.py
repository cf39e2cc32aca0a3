"""What each reader of job_events by seq reads on a filled outbox (migration 0059: a BRIN index
on seq instead of the primary key's B-tree), for the events written one by one.

Not a test: it measures and prints. It starts its own PostgreSQL in a temporary directory,
applies the migrations of the `evora` package on the path (`PYTHONPATH=<checkout>/shared`
picks the schema: a tree before 0059 has the primary key), runs `--what-if` SQL if given
(e.g. the BRIN index again with another pages_per_range), and fills the outbox with
`--events` events in transactions of `--per-transaction` (a claim's batch), dated over
`--days` days so that they fall in that many partitions of a day, after a gap of `--gap`
seqs (what the partitions retention dropped leave). The events are rows of
`evora.job_event_rows` (of `evora.job_events` on a tree before migration 0064, where that was
the table): the batches (migration 0064) stay empty, which every reader reads as well. Then
VACUUM ANALYZE (autovacuum's summarizing of the BRIN ranges, done at once), Evora's clock
moved past the last of those days and the sweeper's round of partitions run
(evora.make_event_partitions()), and per reader the median time, the buffers the reading
transaction fetched (of the schema's tables and indexes, hit or read: every part of the plan,
functions included) and the plan's nodes: the projector's `read_batch` of `--batch` events
from the middle of the tail (the statement of this tree, and with `--previous-sql <tree>` that
tree's, the previous release's, which fetches by `seq = ANY(...)`; `--tree` runs another
tree's statements throughout), the auditor's range of 10,000 seqs, the newest seq and the next
one after the gap, the archive's range of 10,000 seqs (through evora.events_between() from
migration 0064 on), and retention's walk of the expired partitions (of both tables from
migration 0064 on); with `--then-migrate FILE`, how long that migration then takes (run on a
tree before 0059 with 0059's file: the upgrade's index build).

    PYTHONPATH=shared python -m bench.outbox_seq --events 1000000 --days 6
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from evora.embedded import LocalPostgres
from evora.storage.db import connect
from evora.storage.migrate import apply_migrations
from evora.storage.statements import parse

FILL = """
INSERT INTO {rows} (job_id, job_version, queue, type, event, from_state, to_state,
                              attempt, worker_id, at, job)
SELECT gen_random_uuid(), 2, 'q', 't', 'claimed', 'PENDING', 'RUNNING', 1, 'w',
       evora.clock_now() + make_interval(secs => ($2 + n) * $4 * 86400.0 / $3), i.image
FROM generate_series(1, $1) AS n,
     (SELECT evora.event_image(j, 'PENDING') AS image FROM evora.jobs j LIMIT 1) AS i
"""
JOB = """
INSERT INTO evora.jobs (id, queue, type, payload, max_attempts, lease_seconds, backoff_initial,
                        backoff_max, backoff_multiplier, run_at)
VALUES (gen_random_uuid(), 'q', 't', '{}', 3, 30, 1, 60, 2, evora.clock_now())
"""


HERE = Path(__file__).resolve().parents[1]


def statement(tree: Path, file: str, name: str) -> str:
    return parse((tree / "shared/evora/storage/sql" / file).read_text())[name]


def nodes(plan: dict[str, Any]) -> list[str]:
    name = plan["Node Type"]
    if "Index Name" in plan:
        name += f" {plan['Index Name']}"
    elif "Relation Name" in plan and plan["Node Type"] == "Seq Scan":
        name += f" {plan['Relation Name']}"
    found = [name]
    for child in plan.get("Plans", []):
        found += nodes(child)
    return found


# The buffers of the schema's relations (tables and indexes, hit or read) the transaction
# fetched so far, and its sequential scans of them: the figures of a plan's every part
# (EXPLAIN's own leave out those of the CTEs and subplans above the top node) and of the
# statements inside functions.
STATS = """
SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::int8,
       coalesce(sum(pg_stat_get_xact_numscans(c.oid)) FILTER (WHERE c.relkind = 'r'), 0)::int8
FROM pg_class c WHERE c.relnamespace = 'evora'::regnamespace AND c.relkind IN ('r', 'i')
"""


async def explain(conn: asyncpg.Connection, label: str, sql: str, *args: Any) -> None:
    times, buffers, shape, rows = [], 0, "", 0
    for _ in range(3):
        async with conn.transaction():
            b0, _ = await conn.fetchrow(STATS)
            [row] = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *args)
            b1, _ = await conn.fetchrow(STATS)
        [result] = row[0]  # EXPLAIN (FORMAT JSON), decoded by the json codec
        times.append(result["Execution Time"])
        plan = result["Plan"]
        rows = int(plan["Actual Rows"])
        buffers = b1 - b0
        kinds: dict[str, int] = {}
        for n in nodes(plan):
            kinds[n] = kinds.get(n, 0) + 1
        shape = ", ".join(f"{n} x{c}" if c > 1 else n for n, c in sorted(kinds.items()))
    print(f"{label}: {statistics.median(times):.2f} ms, {buffers:,} buffers, {rows} rows")
    print(f"    {shape}")


async def read_in_functions(conn: asyncpg.Connection, label: str, sql: str, *args: Any) -> None:
    """A call of a function whose own statements EXPLAIN does not show: the buffers of the
    schema's relations its transaction fetched (hit or read), and sequential scans."""
    stats = STATS
    times = []
    for _ in range(3):
        async with conn.transaction():
            b0, s0 = await conn.fetchrow(stats)
            t0 = time.perf_counter()
            result = await conn.fetch(sql, *args)
            times.append((time.perf_counter() - t0) * 1000)
            b1, s1 = await conn.fetchrow(stats)
    print(
        f"{label}: {statistics.median(times):.2f} ms, {b1 - b0:,} buffers, "
        f"{s1 - s0} sequential scans, -> {[tuple(r) for r in result][:3]}"
    )


async def run(args: argparse.Namespace, dsn: str) -> None:
    await apply_migrations(dsn)
    conn = await connect(dsn, application_name="bench", statement_timeout=None)
    try:
        # the table of the events written one by one: a view of both tables has that name
        # from migration 0064 on
        batches = await conn.fetchval("SELECT to_regclass('evora.event_batches') IS NOT NULL")
        rows = "evora.job_event_rows" if batches else "evora.job_events"
        if args.what_if:
            await conn.execute(args.what_if)
        await conn.execute("SELECT evora.make_event_partitions(86400, $1)", args.days + 2)
        await conn.execute(JOB)
        await conn.execute(f"SELECT setval(pg_get_serial_sequence('{rows}', 'seq'), $1)", args.gap)
        t0 = time.perf_counter()
        for first in range(0, args.events, args.per_transaction):
            async with conn.transaction():
                await conn.execute("SET LOCAL session_replication_role = replica")
                await conn.execute(
                    FILL.format(rows=rows), args.per_transaction, first, args.events, args.days
                )
        print(f"filled {args.events:,} events in {time.perf_counter() - t0:.0f} s")
        await conn.execute(f"VACUUM (ANALYZE) {rows}")
        # the history in the past, as read in a deployment: the clock past the last
        # partition filled, and the sweeper's round that makes partitions ahead of it
        await conn.execute(
            f"ALTER DATABASE postgres SET evora.clock_offset = '{args.days + 1} days'"
        )
        await conn.close()
        conn = await connect(dsn, application_name="bench", statement_timeout=None)
        await conn.execute("SELECT evora.make_event_partitions(86400, 3)")
        parts = await conn.fetch(
            "SELECT tableoid::regclass::text AS name, count(*) AS n, min(seq) AS lo,"
            " max(seq) AS hi, max(xid::text::int8) AS xid"
            f" FROM {rows} GROUP BY 1 ORDER BY 3"
        )
        for p in parts:
            print(f"  {p['name']}: {p['n']:,} events, seq {p['lo']}..{p['hi']}")
        print(
            await conn.fetchval(
                "SELECT string_agg(c.relname || ' '"
                " || pg_size_pretty(pg_relation_size(c.oid)), ', ')"
                " FROM pg_class c WHERE c.relname LIKE 'job_events_p%' AND c.relkind = 'i'"
                " AND c.relname LIKE $1",
                f"{parts[-2]['name'].split('.')[1]}%",
            )
        )
        # the projector's batch from the middle of the tail, in (xid, seq) order
        xid, seq = await conn.fetchrow(
            f"SELECT xid::text::int8, seq FROM {rows} ORDER BY xid, seq OFFSET $1 LIMIT 1",
            args.events // 2,
        )
        batch_args = [str(xid), seq, args.batch, None, None, {}, 60, None, [], str(xid), seq]
        here = Path(args.tree) if args.tree else HERE
        await explain(
            conn, "read_batch (this tree)", statement(here, "outbox.sql", "read_batch"), *batch_args
        )
        if args.previous_sql:
            await explain(
                conn,
                "read_batch (previous release)",
                statement(Path(args.previous_sql), "outbox.sql", "read_batch"),
                *batch_args,
            )
        mid = args.gap + args.events // 2
        audit_events = statement(here, "audit.sql", "events")
        if "$3" in audit_events:
            await explain(
                conn, "auditor events (range of 10,000)", audit_events, mid, mid + 10_000, None
            )
        else:
            await explain(conn, "auditor events (10,000 from seq)", audit_events, mid, 10_000)
        for name in ("last_seq", "next_seq"):
            try:
                sql = statement(here, "audit.sql", name)
            except KeyError:
                continue
            await read_in_functions(conn, f"auditor {name}", sql, *([2] if "$1" in sql else []))
        below = parts[-1]["xid"] + 1
        # the archive's new seqs (evora_services.pipeline.events.between): through the view a
        # filter on seq reaches no index of the batches
        new_seqs = (
            f"evora.events_between({mid + 1}, {mid + 10_001})"
            if batches
            else f"evora.job_events WHERE seq > {mid} AND seq <= {mid + 10_000}"
        )
        await explain(
            conn,
            "archive between (10,000 new seqs)",
            f"""SELECT seq FROM (SELECT * FROM {new_seqs}) e WHERE xid < '{below}'::xid8
                UNION ALL SELECT seq FROM evora.job_events
                WHERE seq <= {mid} AND xid >= '{below}'::xid8 AND xid < '{below}'::xid8""",
        )
        await conn.execute(
            "UPDATE evora.event_archive_watermark SET upto_seq = $1, below_xid = $2::text::xid8",
            parts[1]["hi"],
            str(below),
        )
        await conn.execute(
            "INSERT INTO evora.projector_progress (generation, xid) VALUES (1, $1::text::xid8)",
            str(below),
        )
        # from migration 0064 on a range's two tables (the older function answers nothing)
        expired = "expired_event_tables" if batches else "expired_event_partitions"
        await read_in_functions(
            conn,
            f"retention {expired}",
            f"SELECT name FROM evora.{expired}(0, true) WHERE attached",
        )
        if args.then_migrate:
            # what the upgrade holds writers of events back for (its locks, its index build)
            t0 = time.perf_counter()
            await conn.execute(args.then_migrate_sql)
            print(f"{args.then_migrate}: {time.perf_counter() - t0:.1f} s")
    finally:
        await conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--per-transaction", type=int, default=100)
    parser.add_argument("--days", type=int, default=6)
    parser.add_argument("--gap", type=int, default=5_000_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--what-if", help="SQL run after the migrations")
    parser.add_argument("--previous-sql", help="a tree whose read_batch to measure as well")
    parser.add_argument("--tree", help="the tree whose statements to run (default: this one)")
    parser.add_argument("--then-migrate", help="a migration's SQL file to run and time at the end")
    args = parser.parse_args()
    args.then_migrate_sql = Path(args.then_migrate).read_text() if args.then_migrate else None
    with (
        tempfile.TemporaryDirectory(prefix="evora-outbox-seq-") as tmp,
        LocalPostgres(Path(tmp) / "data", log_path=Path(tmp) / "postgres.log") as pg,
    ):
        asyncio.run(run(args, pg.dsn("postgres")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
