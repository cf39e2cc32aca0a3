"""What the auditor (evora.storage.audit, docs/audit.md) costs: the time of one audit over
the newest 10k events and over the whole history of about 100k events, on a history the
system's own statements wrote.

Not a test: it measures and prints. It starts its own PostgreSQL, applies the migrations and
writes the history through `JobStore` (batch submits, claims of 100, completions and some
failures, a third of the jobs in FIFO groups, some with limit keys, under a concurrency
limit so the limit checks have claims to replay; first, a fifth of the events in a fair queue
of 20 fairness keys, claimed before the limit exists, so the fair claims are tagged and
`fair_virtual_time` has claims to replay), then times `audit()` over windows of the
newest N events (`from_seq`), each `--rounds` times, and prints the median seconds and
microseconds per event, with the CPU each audit cost per event: this process's (the auditor's
Python, as in the sweeper) and its connection's backend's (PostgreSQL), read from /proc
(10 ms ticks: over 100,000 events, 0.1 us per event).

`--baseline REV` also times that revision's auditor (its evora/storage/audit.py and
sql/audit.sql, from git; the schema is this checkout's) on the same history, the two
alternating within each round: on a loaded machine only such pairs compare.

    python -m bench.audit --events 100000 --rounds 5
    python -m bench.audit --events 100000 --rounds 7 --baseline 64cdefc
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from unittest import mock

import asyncpg

from bench import procstats
from evora.embedded import LocalPostgres
from evora.protocol.jobs import JobSubmission
from evora.storage import statements
from evora.storage.audit import AuditReport, audit
from evora.storage.db import create_pool
from evora.storage.jobs import Completion, Failure, JobStore
from evora.storage.migrate import apply_migrations

Audit = Callable[..., Awaitable[AuditReport]]

QUEUE = "bench"
FAIR_QUEUE = "bench-fair"
# How many events there are: the rows, and the batches' events counted by their seqs, which
# count(*) of the `job_events` view would unfold one by one (migration 0064).
EVENTS = """
SELECT (SELECT count(*) FROM evora.job_event_rows)
       + (SELECT coalesce(sum(cardinality(b.seqs)), 0) FROM evora.event_batches b)
"""


async def write_history(dsn: str, events: int) -> int:
    """About `events` events (three per job: submitted, claimed, completed; a failed
    attempt adds two); returns how many there are."""
    pool = await create_pool(dsn, min_size=1, max_size=4)
    store = JobStore(pool)
    try:
        # the fair claim serves a fair queue only while no concurrency or rate limit exists
        while (await pool.fetchval(EVENTS)) < events // 5:
            await store.submit_batch(
                [
                    JobSubmission(queue=FAIR_QUEUE, type="t", fairness_key=f"tenant:{i % 20}")
                    for i in range(500)
                ]
            )
            while claimed := await store.claim(worker_id="w", queues=[FAIR_QUEUE], max_jobs=100):
                await store.complete_many(
                    [Completion(j["id"], j["lease_token"], None) for j in claimed]
                )
        await pool.execute(
            "INSERT INTO evora.flow_limits (key, concurrency) VALUES ('tenant:*', 1000)"
        )
        n = 0
        while (await pool.fetchval(EVENTS)) < events:
            await store.submit_batch(
                [
                    JobSubmission(
                        queue=QUEUE,
                        type="t",
                        group_key=f"g{(n + i) % 50}" if (n + i) % 3 == 0 else None,
                        limit_keys=[f"tenant:{(n + i) % 20}"] if (n + i) % 4 == 0 else [],
                        max_attempts=3,
                    )
                    for i in range(500)
                ]
            )
            n += 500
            while claimed := await store.claim(worker_id="w", queues=[QUEUE], max_jobs=100):
                fails = [j for j in claimed if j["id"].int % 10 == 0 and j["attempt"] == 1]
                if fails:
                    await store.fail_many(
                        [Failure(j["id"], j["lease_token"], "x", retry_in_seconds=0) for j in fails]
                    )
                await store.complete_many(
                    [Completion(j["id"], j["lease_token"], None) for j in claimed if j not in fails]
                )
        total: int = await pool.fetchval(EVENTS)
        await pool.execute("VACUUM ANALYZE")
        return total
    finally:
        await store.close()
        await pool.close()


def baseline_audit(revision: str, directory: Path) -> Audit:
    """The `audit()` of another revision: its module from git, imported under a name of its
    own, reading its statements from that revision's sql/audit.sql."""
    root = Path(__file__).resolve().parents[1]

    def show(path: str) -> str:
        return subprocess.run(
            ["git", "show", f"{revision}:{path}"],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    source = directory / "baseline_audit.py"
    source.write_text(show("shared/evora/storage/audit.py"))
    sql = statements.parse(show("shared/evora/storage/sql/audit.sql"))

    def load(_file: str, *names: str) -> tuple[str, ...]:
        return tuple(statements.with_rules(sql[name]) for name in names)

    spec = importlib.util.spec_from_file_location("baseline_audit", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    with mock.patch.object(statements, "load", load):
        spec.loader.exec_module(module)
    baseline: Audit = module.audit
    return baseline


async def run(
    dsn: str, events: int, rounds: int, windows: Sequence[int], auditors: dict[str, Audit]
) -> None:
    await apply_migrations(dsn)
    t0 = time.perf_counter()
    total = await write_history(dsn, events)
    print(f"history: {total} events written in {time.perf_counter() - t0:.0f} s")
    print(f"load average {procstats.load_average()}")
    conn = await asyncpg.connect(dsn)
    try:
        last: int = await conn.fetchval("SELECT evora.last_event_seq()")
        backend: int = await conn.fetchval("SELECT pg_backend_pid()")
        for window in (*windows, total):
            from_seq = max(1, last - window + 1)
            # per auditor: (wall s, Python CPU s, PostgreSQL CPU s) of each run
            runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in auditors}
            events = jobs = 0
            for round_ in range(rounds):
                # the order alternates, so neither is always the one after the other
                order = list(auditors) if round_ % 2 == 0 else list(reversed(auditors))
                for name in order:
                    started = time.perf_counter()
                    own = procstats.own_cpu_seconds()
                    pg = procstats.cpu_seconds(backend) or 0.0
                    result = await auditors[name](conn, from_seq=from_seq)
                    runs[name].append(
                        (
                            time.perf_counter() - started,
                            procstats.own_cpu_seconds() - own,
                            (procstats.cpu_seconds(backend) or 0.0) - pg,
                        )
                    )
                    assert result.ok, result.text()
                    events, jobs = result.events, result.jobs
            for name, times in runs.items():
                wall, python, postgres = (statistics.median(t[i] for t in times) for i in range(3))
                per = 1e6 / events
                print(
                    f"{name}: window of {events:>7} events ({jobs:>6} jobs): "
                    f"median {wall:.3f} s over {rounds} runs, {wall * per:.1f} us per event; "
                    f"CPU per event: Python {python * per:.2f} us, PostgreSQL "
                    f"{postgres * per:.2f} us"
                )
        print(f"load average {procstats.load_average()}")
    finally:
        await conn.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", help="git revision whose auditor to time alongside")
    args = parser.parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="evora-bench-audit-") as tmp,
        LocalPostgres(Path(tmp) / "data", durable=False) as pg,
    ):
        auditors: dict[str, Audit] = {"this checkout": audit}
        if args.baseline:
            auditors = {args.baseline: baseline_audit(args.baseline, Path(tmp)), **auditors}
        asyncio.run(run(pg.dsn("postgres"), args.events, args.rounds, (10_000,), auditors))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
