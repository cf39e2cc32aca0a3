"""The readers of PENDING jobs by queue and due time over a large `jobs` table: what each costs.

Not a test: it measures and prints. It starts its own PostgreSQL in a temporary directory,
applies the migrations of the `evora` package on the path (so `PYTHONPATH=<checkout>/shared`
picks the schema and the statements to measure), runs `--what-if` SQL if given, loads
`--jobs` rows straight into `evora.jobs` (triggers off): most of them finished, `--pending`
of them PENDING over `--priorities` priorities, half of those due and half delayed up to a
day, in three queues (90 %, 9 %, 1 %), `--holders` of the PENDING jobs of `mid` holding the
limit key `api:x`. It then runs every statement that reads PENDING jobs by queue and due time
(the dispatcher's next due time and unclaimed-jobs report, the projector's oldest due job, a
limit's held-back jobs and the queues a limit wakes; then, under limits without room left
on `queue:rare` and on `api:*` (a token an hour, spent), the metrics' usage per kind of key, a
prefix limit's usage and pages of the keys a limit governs), each `--repeat` times under EXPLAIN
ANALYZE, and prints the median execution time, the buffers read and the indexes the plan
uses; then the size of the indexes by due time, and how long building the one there is again
takes. A statement is given only as many of the arguments below as it has parameters, so an
older checkout's statements (which had fewer: the caps on what the readers of the backlog
look at came later) are measured by the same cases.

    python -m bench.pending_readers --jobs 1000000 --priorities 5
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
from pathlib import Path
from typing import Any

import asyncpg

from bench import plans
from evora.embedded import LocalPostgres
from evora.storage import limits, outbox, queries
from evora.storage.migrate import apply_migrations

QUEUES = ("big", "mid", "rare")

LOAD = """
INSERT INTO evora.jobs (id, queue, type, payload, priority, state, attempt, max_attempts,
                        lease_seconds, backoff_initial, backoff_max, backoff_multiplier, run_at,
                        worker_id, started_at, finished_at, created_at, updated_at)
SELECT gen_random_uuid(), q.queue, 't' || (n % 20), '{}',
       CASE WHEN p.pending THEN floor(h.r3 * $3::int4)::int4 % $3::int4 ELSE 0 END,
       CASE WHEN p.pending THEN 'PENDING' ELSE 'COMPLETED' END::evora.job_state,
       CASE WHEN p.pending THEN 0 ELSE 1 END, 3, 60, 1, 60, 2,
       -- half of the PENDING jobs due (up to an hour ago), half delayed (up to a day ahead)
       CASE WHEN p.pending AND h.r3 * 1000 % 2 >= 1 THEN now() + make_interval(secs => h.r * 86400)
            ELSE now() - make_interval(secs => h.r * 3600) END,
       CASE WHEN NOT p.pending THEN 'w' END, CASE WHEN NOT p.pending THEN now() END,
       CASE WHEN NOT p.pending THEN now() END, now(), now()
FROM generate_series(1, $1) AS n
CROSS JOIN LATERAL (SELECT hashint4(n) / 4294967296.0 + 0.5 AS r,
                           hashint4(n + 7919) / 4294967296.0 + 0.5 AS r2,
                           hashint4(n + 104729) / 4294967296.0 + 0.5 AS r3) AS h
CROSS JOIN LATERAL (SELECT n % ($1 / $2) = 0 AS pending) AS p
CROSS JOIN LATERAL (SELECT CASE WHEN h.r2 < 0.9 THEN 'big' WHEN h.r2 < 0.99 THEN 'mid'
                                ELSE 'rare' END AS queue) AS q
"""


async def run(args: argparse.Namespace, dsn: str) -> None:
    await apply_migrations(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        if args.what_if:
            await conn.execute(args.what_if)
        await conn.execute("SET session_replication_role = replica")  # no triggers: a bulk load
        await conn.execute(LOAD, args.jobs, args.pending, args.priorities)
        await conn.execute(
            "UPDATE evora.jobs SET limit_keys = '{api:x}' WHERE id IN (SELECT id FROM evora.jobs"
            " WHERE state = 'PENDING' AND queue = 'mid' LIMIT $1)",
            args.holders,
        )
        await conn.execute("RESET session_replication_role")
        await conn.execute("VACUUM ANALYZE evora.jobs")
        counts = await conn.fetch(
            "SELECT queue, count(*) AS n, count(*) FILTER (WHERE run_at > now()) AS delayed,"
            " count(DISTINCT priority) AS priorities FROM evora.jobs WHERE state = 'PENDING'"
            " GROUP BY queue ORDER BY queue"
        )
        print(
            f"{args.jobs:,} jobs; PENDING: "
            + ", ".join(
                f"{r['queue']} {r['n']:,} ({r['delayed']:,} delayed, {r['priorities']} priorities)"
                for r in counts
            )
            + f"; median of {args.repeat} EXPLAIN ANALYZE runs"
        )
        cases: list[tuple[str, str, list[Any]]] = [
            *((f"next_due {q}", queries.NEXT_DUE, [[q]]) for q in QUEUES),
            ("next_due all queues", queries.NEXT_DUE, [list(QUEUES)]),
            ("oldest_due all queues", outbox.OLDEST_DUE, [list(QUEUES)]),
            # after 300 s (the default), at most 100 rows, 1,000 jobs looked at per queue
            ("unclaimed_jobs", queries.UNCLAIMED_JOBS, [300, 100, 1000]),
            # concurrency 0: no room, the held back counted (up to 1,000)
            *(
                (f"key_usage {key} (full)", limits.USAGE, [key, 0, None, None, 1000])
                for key in ("queue:rare", "queue:big", "api:x")
            ),
            # reading up to 1,000 jobs holding the key
            *(
                (f"wake_limited_queues {key}", limits.WAKE, [key, 1000])
                for key in ("queue:mid", "api:x", "api:none", "tenant:*")
            ),
        ]
        await _explain(conn, cases, args.repeat)
        # limits without room, and the buckets of the keys claims have tried under them (after
        # the cases above, which they would change)
        for key in ("queue:rare", "api:*"):
            await conn.execute(
                "INSERT INTO evora.flow_limits (key, rate_limit, rate_per_seconds)"
                " VALUES ($1, 1, 3600)",
                key,
            )
        await conn.execute(
            "INSERT INTO evora.flow_buckets (key, tokens, refilled_at)"
            " VALUES ('queue:rare', 0, now()), ('api:x', 0, now())"
        )
        limited: list[tuple[str, str, list[Any]]] = [
            # up to 1,000 held back counted per kind, per prefix limit, per key of a page
            ("usage_by_kind", limits.USAGE_BY_KIND, [1000]),
            ("prefix_usage api:* (full)", limits.PREFIX_USAGE, ["api:", None, 1, 3600.0, 1000]),
            *(
                (
                    f"governed_keys {key} (full)",
                    limits.GOVERNED_KEYS,
                    [key, stem, None, 101, None, 1, 3600.0, 1000],
                )
                for key, stem in (("api:*", "api:"), ("queue:rare", None))
            ),
        ]
        await _explain(conn, limited, args.repeat)
        await plans.print_index_sizes(conn, ("jobs_claimable", "jobs_delayed", "jobs_scheduled"))
        # what building it again takes (the upgrade that makes it holds writes back as long)
        await plans.print_rebuild_times(conn, ("jobs_delayed", "jobs_scheduled"))
    finally:
        await conn.close()


async def _explain(
    conn: asyncpg.Connection, cases: list[tuple[str, str, list[Any]]], repeat: int
) -> None:
    for label, sql, params in cases:
        given = params[: max((int(n) for n in re.findall(r"\$(\d+)", sql)), default=0)]
        ms, buffers, used = await plans.explain(conn, sql, given, repeat)
        shown = ", ".join(sorted(used)) or "(no index)"
        print(f"  {label:<32} {ms:9.3f} ms  {buffers:7d} buffers  {shown}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=100_000, help="of them PENDING")
    parser.add_argument("--priorities", type=int, default=5, help="distinct priorities")
    parser.add_argument("--holders", type=int, default=5_000, help="of them holding api:x")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--what-if", help="SQL run after the migrations")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="evora-pending-readers-") as tmp,
        LocalPostgres(Path(tmp) / "data", log_path=Path(tmp) / "postgres.log") as pg,
    ):
        asyncio.run(run(args, pg.dsn("postgres")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
