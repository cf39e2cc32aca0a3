"""The admin job listing over a large `jobs` table: how long each page takes, by filter.

Not a test: it measures and prints. It starts its own PostgreSQL in a temporary directory,
applies the migrations of the `evora` package on the path (so `PYTHONPATH=<checkout>/shared`
picks the schema and the listing statements to measure), loads `--jobs` rows straight into
`evora.jobs` (triggers off: a table as a long-running installation has it, most of it
finished), and runs every listing the api builds (`queries.list_jobs`: no filter, queue,
state, type and their pairs; first page and a page further on) plus the other readers of the
listing's indexes (redrive's DLQ batch, admission's count of a queue's waiting jobs), each
`--repeat` times under EXPLAIN ANALYZE, printing the median execution time, the buffers read
and the indexes the plan uses; then the size of every index of `jobs`, and how long building
the listing's indexes again takes.

    python -m bench.listing --jobs 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import asyncpg

from bench import plans
from evora.embedded import LocalPostgres
from evora.storage import queries
from evora.storage.migrate import apply_migrations

PAGE = 51  # the api reads a page of 50 and one more to know whether another follows

# (state, share of the jobs): a table where most rows are finished, some wait, a few run
STATES = (
    ("COMPLETED", 0.86),
    ("PENDING", 0.06),
    ("DLQ", 0.03),
    ("CANCELLED", 0.02),
    ("WAITING", 0.02),
    ("RUNNING", 0.01),
)
# (queue, share): one large queue, a middling one, a rare one
QUEUES = (("big", 0.9), ("mid", 0.09), ("rare", 0.01))

LOAD = """
INSERT INTO evora.jobs (id, queue, type, payload, state, attempt, max_attempts, lease_seconds,
                        backoff_initial, backoff_max, backoff_multiplier, run_at, lease_token,
                        lease_expires_at, worker_id, started_at, finished_at, dependencies_left,
                        created_at, updated_at)
SELECT evora.uuid7(), q.queue, 't' || (n % 20), '{}', s.state::evora.job_state,
       CASE WHEN s.state IN ('PENDING', 'WAITING') THEN 0 ELSE 1 END, 3, 60, 1, 60, 2,
       now() - make_interval(secs => ($1 - n) / 100.0),
       CASE WHEN s.state = 'RUNNING' THEN gen_random_uuid() END,
       CASE WHEN s.state = 'RUNNING' THEN now() + interval '60 s' END,
       CASE WHEN s.state NOT IN ('PENDING', 'WAITING') THEN 'w' END,
       CASE WHEN s.state NOT IN ('PENDING', 'WAITING') THEN now() END,
       CASE WHEN s.state IN ('COMPLETED', 'DLQ', 'CANCELLED') THEN now() END,
       CASE WHEN s.state = 'WAITING' THEN 1 ELSE 0 END, now(), now()
FROM generate_series(1, $1) AS n
CROSS JOIN LATERAL (SELECT hashint4(n) / 4294967296.0 + 0.5 AS r,
                           hashint4(n + 7919) / 4294967296.0 + 0.5 AS r2) AS h
CROSS JOIN LATERAL (
    SELECT x.state FROM jsonb_to_recordset($2::jsonb) AS x(state text, upto float8)
    WHERE h.r < x.upto ORDER BY x.upto LIMIT 1) AS s
CROSS JOIN LATERAL (
    SELECT x.queue FROM jsonb_to_recordset($3::jsonb) AS x(queue text, upto float8)
    WHERE h.r2 < x.upto ORDER BY x.upto LIMIT 1) AS q
"""


def _cumulative(shares: tuple[tuple[str, float], ...], name: str) -> str:
    total, rows = 0.0, []
    for value, share in shares:
        total += share
        rows.append({name: value, "upto": total})
    rows[-1]["upto"] = 1.1
    return json.dumps(rows)


async def run(args: argparse.Namespace, dsn: str) -> None:
    await apply_migrations(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET session_replication_role = replica")  # no triggers: a bulk load
        await conn.execute(
            LOAD, args.jobs, _cumulative(STATES, "state"), _cumulative(QUEUES, "queue")
        )
        await conn.execute("RESET session_replication_role")
        await conn.execute("VACUUM ANALYZE evora.jobs")
        middle = await conn.fetchval(
            "SELECT id FROM evora.jobs ORDER BY id OFFSET $1 LIMIT 1",
            args.jobs // 2,
        )
        values = {"queue": "rare", "state": "DLQ", "type": "t3"}
        cases: list[tuple[str, str, list[Any]]] = []
        for filters in ((), ("queue",), ("state",), ("type",), ("queue", "state")):
            for after in (False, True):
                label = "+".join(filters) or "none"
                params = [values[f] for f in filters] + [PAGE] + ([middle] if after else [])
                sql = queries.list_jobs(filters, after=after)
                cases.append((f"list {label}{' after' if after else ''}", sql, params))
        for queue, state in (("big", "COMPLETED"), ("big", "RUNNING"), ("big", "PENDING")):
            sql = queries.list_jobs(("queue", "state"), after=False)
            cases.append((f"list queue={queue} state={state}", sql, [queue, state, PAGE]))
        cases.append(
            (
                "redrive batch (queue big, DLQ)",
                "SELECT id FROM evora.jobs WHERE queue = $1 AND state = 'DLQ'"
                " ORDER BY id LIMIT 100",
                ["big"],
            )
        )
        cases.append(
            ("admission count queue:big", "SELECT evora.pending_holding($1, 1001)", ["queue:big"])
        )
        print(f"{args.jobs:,} jobs; median of {args.repeat} EXPLAIN ANALYZE runs")
        for label, sql, params in cases:
            ms, buffers, used = await plans.explain(conn, sql, params, args.repeat)
            shown = ", ".join(sorted(used)) or "(no index)"
            print(f"  {label:<36} {ms:9.3f} ms  {buffers:7d} buffers  {shown}")
        await plans.print_index_sizes(conn)
        # what building them again takes (an upgrade that makes one holds writes back as long)
        await plans.print_rebuild_times(
            conn, ("jobs_listing", "jobs_listing_at_rest", "jobs_submit_seq", "jobs_listing_by_id")
        )
    finally:
        await conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="evora-listing-") as tmp,
        LocalPostgres(Path(tmp) / "data", log_path=Path(tmp) / "postgres.log") as pg,
    ):
        asyncio.run(run(args, pg.dsn("postgres")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
