"""A/B of the statements that end attempts (`complete`, `fail`, `release`, `expire_leases`)
between this checkout and an earlier revision, on one PostgreSQL, interleaved.

Not a test: it measures and prints. It starts its own durable PostgreSQL (fsync and
synchronous_commit on), applies this checkout's migrations, and reads the baseline's
statements from `git show <baseline>:shared/evora/storage/sql/transitions.sql` (they must run
on this checkout's schema, which only adds to earlier ones). Each round, for each variant in
turn, it submits and claims a fresh set of jobs, then ends every attempt with one statement
kind, timing those statements alone:

- complete:      batches of 100 completions (the drain's hot path),
- fail:          batches of 100 retryable failures (back to PENDING after the backoff),
- release:       one release per job (the worker hands the claim back),
- expire_leases: the sweeper's batches of 100, after the clock is run past the leases.

It prints the median microseconds per ended job of each variant and statement over the
rounds, and their ratio. The submit and claim around them are not timed.

    python -m bench.attempt_endings --baseline ab92bd1 --rounds 7 --jobs 2000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import asyncpg

from evora.embedded import LocalPostgres
from evora.storage import queries
from evora.storage.migrate import apply_migrations
from evora.storage.statements import parse

BATCH = 100
STATEMENTS = ("complete", "fail", "release", "expire_leases")
TRANSITIONS = "shared/evora/storage/sql/transitions.sql"


def baseline_statements(revision: str) -> dict[str, str]:
    root = Path(__file__).resolve().parents[1]
    text = subprocess.run(
        ["git", "show", f"{revision}:{TRANSITIONS}"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return parse(text)


async def claimed(
    conn: asyncpg.Connection, queue: str, count: int
) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """Submit `count` jobs and claim them all; (id, lease token) of each."""
    for offset in range(0, count, 500):
        size = min(500, count - offset)
        await conn.execute(
            "SELECT evora.submit_batch($1::jsonb)",
            "[" + ",".join(f'{{"queue": "{queue}", "type": "t"}}' for _ in range(size)) + "]",
        )
    taken: list[tuple[uuid.UUID, uuid.UUID]] = []
    while len(taken) < count:
        rows = await conn.fetch(queries.CLAIM, [queue], None, 500, "bench-worker")
        taken += [(r["job"]["id"], r["job"]["lease_token"]) for r in rows]
    return taken


async def end_by_complete(
    conn: asyncpg.Connection, sql: str, jobs: Sequence[tuple[uuid.UUID, uuid.UUID]]
) -> float:
    spent = 0.0
    for i in range(0, len(jobs), BATCH):
        part = jobs[i : i + BATCH]
        t0 = time.perf_counter()
        rows = await conn.fetch(
            sql, [j for j, _ in part], [t for _, t in part], ["{}"] * len(part), [], False
        )
        spent += time.perf_counter() - t0
        require_done(rows, len(part))
    return spent


async def end_by_fail(
    conn: asyncpg.Connection, sql: str, jobs: Sequence[tuple[uuid.UUID, uuid.UUID]]
) -> float:
    spent = 0.0
    for i in range(0, len(jobs), BATCH):
        part = jobs[i : i + BATCH]
        errors = ['{"message": "boom", "type": "Bench"}'] * len(part)
        t0 = time.perf_counter()
        rows = await conn.fetch(
            sql,
            [j for j, _ in part],
            [t for _, t in part],
            errors,
            [True] * len(part),
            [3600.0] * len(part),
            [],
            False,
        )
        spent += time.perf_counter() - t0
        require_done(rows, len(part))
    return spent


def require_done(rows: Sequence[asyncpg.Record], expected: int) -> None:
    """A measurement counts only if every attempt it timed did end."""
    done = sum(r["outcome"] == "done" for r in rows)
    if done != expected:
        raise RuntimeError(f"{done} of {expected} attempts ended")


async def end_by_release(
    conn: asyncpg.Connection, sql: str, jobs: Sequence[tuple[uuid.UUID, uuid.UUID]]
) -> float:
    spent = 0.0
    for job_id, token in jobs:
        t0 = time.perf_counter()
        rows = await conn.fetch(sql, job_id, token, 3600.0, [])
        spent += time.perf_counter() - t0
        require_done(rows, 1)
    return spent


async def end_by_expiry(
    conn: asyncpg.Connection, sql: str, jobs: Sequence[tuple[uuid.UUID, uuid.UUID]]
) -> float:
    # Run this session's clock past every lease instead of waiting for them to run out.
    await conn.execute("SET evora.clock_offset = '1 day'")
    spent = 0.0
    try:
        ended = 0
        while ended < len(jobs):
            t0 = time.perf_counter()
            rows = await conn.fetch(sql, BATCH, [])
            spent += time.perf_counter() - t0
            if not rows:
                raise RuntimeError(f"expire_leases ended {ended} of {len(jobs)} attempts")
            ended += len(rows)
    finally:
        await conn.execute("RESET evora.clock_offset")
    return spent


Ender = Callable[[asyncpg.Connection, str, Sequence[tuple[uuid.UUID, uuid.UUID]]], Awaitable[float]]
ENDERS: dict[str, Ender] = {
    "complete": end_by_complete,
    "fail": end_by_fail,
    "release": end_by_release,
    "expire_leases": end_by_expiry,
}


async def run(dsn: str, variants: dict[str, dict[str, str]], rounds: int, jobs: int) -> None:
    await apply_migrations(dsn)
    conn = await asyncpg.connect(dsn)
    samples: dict[tuple[str, str], list[float]] = {}
    try:
        for round_no in range(rounds):
            for statement in STATEMENTS:
                order = list(variants) if round_no % 2 == 0 else list(reversed(variants))
                for variant in order:
                    # a queue of its own: what earlier measurements left is never in the way
                    taken = await claimed(conn, f"bench{len(samples)}-{round_no}", jobs)
                    spent = await ENDERS[statement](conn, variants[variant][statement], taken)
                    samples.setdefault((statement, variant), []).append(spent / jobs * 1e6)
            print(f"round {round_no + 1}/{rounds} done", file=sys.stderr)
    finally:
        await conn.close()
    names = list(variants)
    print(f"{'statement':<15}" + "".join(f"{n + ' us/job':>22}" for n in names) + f"{'ratio':>8}")
    for statement in STATEMENTS:
        medians = [statistics.median(samples[(statement, n)]) for n in names]
        ratio = medians[-1] / medians[0]
        print(f"{statement:<15}" + "".join(f"{m:>22.1f}" for m in medians) + f"{ratio:>8.2f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--baseline", required=True, help="git revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs ended per measurement")
    args = parser.parse_args(argv)
    current = {name: getattr(queries, name.upper()) for name in STATEMENTS}
    variants = {args.baseline: baseline_statements(args.baseline), "this checkout": current}
    with (
        tempfile.TemporaryDirectory(prefix="evora-bench-") as tmp,
        LocalPostgres(Path(tmp) / "data", durable=True, log_path=Path(tmp) / "pg.log") as pg,
    ):
        asyncio.run(run(pg.dsn("postgres"), variants, args.rounds, args.jobs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
