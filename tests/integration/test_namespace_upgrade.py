"""Migration 0030 moves every object of Evora's into the schema `evora` (issue 32): on a
database the previous release built and filled, every row is there afterwards under its new
name, the sequences go on where they were, the current code serves it, and the database's
own schema (`public`) holds nothing of Evora's, as on a database migrated from nothing.

The database before is made by the previous release itself: its `evora migrate` and its
stores (JobStore, LimitStore, ScheduleStore), run from its commit in a process of their own,
so the test does not depend on what this code still knows of the old names."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage import drift
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import NAMESPACE_VERSION, apply_migrations
from tests.conftest import MakeDatabase

REPO = Path(__file__).resolve().parents[2]

# main just before migration 0030: schema version 0029, with Evora's tables, types and most
# functions in the deployment's own schema and its records there as evora_migrations and
# evora_function_files.
BEFORE_NAMESPACE = "c19c6d0"

# What the previous release does, in its own process: migrate, then fill every table through
# its stores: jobs in every state (with events, idempotency keys, dependencies, limit keys
# and a group), a limit and its history, a schedule, a paused queue, a trace; and what the
# projector and the archiver would record. Prints the ids it made, by the state they end in.
_FILL = r"""
import asyncio, json, sys
from datetime import datetime, timezone
import asyncpg
from evora.domain.misfire import Misfire
from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import Failure, JobStore
from evora.storage.limits import LimitSpec, LimitStore
from evora.storage.migrate import apply_migrations
from evora.storage.schedules import ScheduleSpec, ScheduleStore

async def main(dsn):
    await apply_migrations(dsn)
    pool = await create_pool(dsn, min_size=1, max_size=2)
    store = JobStore(pool)
    ids = {}
    def sub(**fields):
        return JobSubmission(**{"queue": "q", "type": "t", **fields})
    await LimitStore(pool).put("tenant:*", LimitSpec(concurrency=5, rate=None))
    done, dead, running = [
        (await store.submit(sub(idempotency_key=f"k{i}", limit_keys=["tenant:1"]))).job["id"]
        for i in range(3)
    ]
    waiting = (await store.submit(sub(depends_on=[running], group_key="g"))).job["id"]
    claimed = {j["id"]: j for j in await store.claim(worker_id="w", queues=["q"], max_jobs=10)}
    await store.complete(done, claimed[done]["lease_token"], {"ok": True})
    await store.fail(Failure(dead, claimed[dead]["lease_token"], "no", retryable=False))
    pending = (await store.submit(sub(priority=3, payload={"n": 1}))).job["id"]
    cancelled = (await store.submit(sub())).job["id"]
    await store.cancel(cancelled)
    traced = (await store.submit_batch(
        [sub(queue="paused")],
        ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]))[0].job["id"]
    await store.pause("paused")
    await ScheduleStore(pool, store).put(
        "nightly",
        ScheduleSpec(cron="0 3 * * *", timezone="UTC", job={"queue": "q", "type": "n"},
                     misfire=Misfire.SKIP, misfire_grace_seconds=60, paused=False),
        datetime.now(timezone.utc))
    async with pool.acquire() as conn:
        await conn.execute("INSERT INTO projector_progress (generation, xid, seq) "
                           "VALUES (1, pg_snapshot_xmin(pg_current_snapshot()), 2)")
        await conn.execute("UPDATE event_archive_watermark SET upto_seq = 1")
    await store.close()
    await pool.close()
    print(json.dumps({"COMPLETED": str(done), "DLQ": str(dead), "RUNNING": str(running),
                      "WAITING": str(waiting), "PENDING": str(pending),
                      "CANCELLED": str(cancelled), "traced": str(traced)}))

asyncio.run(main(sys.argv[1]))
"""

_TABLES = """
SELECT c.relname FROM pg_class c
WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p')
ORDER BY 1
"""

# Evora's tables under their names before 0030 and after it.
_RENAMED = {"evora_migrations": "migrations", "evora_function_files": "function_files"}


@pytest.fixture(scope="module")
def before_namespace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `shared` folder of BEFORE_NAMESPACE (its package `evora`)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", BEFORE_NAMESPACE, "shared"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    folder = tmp_path_factory.mktemp("before-namespace")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder / "shared"


def _previous_release(shared: Path, dsn: str) -> dict[str, UUID]:
    env = {**os.environ, "PYTHONPATH": str(shared)}
    out = subprocess.run(
        [sys.executable, "-c", _FILL, dsn],
        capture_output=True,
        text=True,
        env=env,
        cwd=shared,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return {k: UUID(v) for k, v in json.loads(out.stdout.splitlines()[-1]).items()}


async def _empty_database(make_db_url: MakeDatabase) -> str:
    dsn = await make_db_url()
    conn = await asyncpg.connect(dsn)
    try:  # start from nothing, not from the migrated template
        await conn.execute(
            "DROP SCHEMA evora CASCADE; DROP SCHEMA public CASCADE; CREATE SCHEMA public"
        )
    finally:
        await conn.close()
    return dsn


async def _snapshot(
    conn: asyncpg.Connection, schema: str, name: Callable[[str], str]
) -> dict[str, list[str]]:
    """Every row of every table of `schema`, by the table's name after 0030 (`name`)."""
    rows: dict[str, list[str]] = {}
    for table in [r[0] for r in await conn.fetch(_TABLES, schema)]:
        qualified = f"{schema}.{table}"
        texts = await conn.fetch(f"SELECT t::text FROM {qualified} t ORDER BY t::text")
        rows[name(table)] = [r[0] for r in texts]
    return rows


async def _sequences(conn: asyncpg.Connection, schema: str) -> dict[str, int]:
    found = await conn.fetch(
        "SELECT sequencename, last_value FROM pg_sequences WHERE schemaname = $1", schema
    )
    return {r["sequencename"]: r["last_value"] for r in found}


_OURS_IN_PUBLIC = """
SELECT 'relation ' || relname FROM pg_class WHERE relnamespace = 'public'::regnamespace
UNION ALL
SELECT 'function ' || proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace
UNION ALL
SELECT 'type ' || typname FROM pg_type WHERE typnamespace = 'public'::regnamespace
"""


async def test_a_freshly_migrated_database_keeps_nothing_in_public(db_url: str) -> None:
    conn = await asyncpg.connect(db_url)
    try:
        assert await conn.fetch(_OURS_IN_PUBLIC) == []
    finally:
        await conn.close()


async def test_the_previous_releases_database_moves_whole_and_serves(
    make_db_url: MakeDatabase, before_namespace: Path
) -> None:
    dsn = await _empty_database(make_db_url)
    ids = _previous_release(before_namespace, dsn)
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT max(version) FROM public.evora_migrations") == (
            NAMESPACE_VERSION - 1
        )
        before = await _snapshot(conn, "public", lambda t: _RENAMED.get(t, t))
        sequences = await _sequences(conn, "public")
        # jobs in every state, and every table the previous release fills, filled
        states = dict(await conn.fetch("SELECT id, state::text FROM public.jobs"))
        assert {states[ids[s]] for s in ids if s != "traced"} == {
            "PENDING",
            "RUNNING",
            "WAITING",
            "COMPLETED",
            "CANCELLED",
            "DLQ",
        }
        empty = {t for t, rows in before.items() if not rows}
        assert empty <= {"job_prune_counts", "event_archive_runs", "flow_buckets"}, empty

        assert NAMESPACE_VERSION in await apply_migrations(dsn)

        assert await conn.fetch(_OURS_IN_PUBLIC) == []
        after = await _snapshot(conn, "evora", lambda t: t)
        added = f"({NAMESPACE_VERSION},one_namespace,"
        migrations = after.pop("migrations")
        assert [m for m in migrations if not m.startswith(added)] == before.pop("migrations")
        assert sum(m.startswith(added) for m in migrations) == 1
        # the function files were applied again, by this code
        assert after.pop("function_files") != before.pop("function_files")
        assert after == before
        assert await _sequences(conn, "evora") == sequences
        assert await drift.drift(conn) == []
    finally:
        await conn.close()
    await _serves(dsn, ids, sequences)


async def _serves(dsn: str, ids: dict[str, UUID], sequences: dict[str, int]) -> None:
    """The current stores on the moved database: the old jobs go on, new ones are numbered
    after them."""
    pool = await create_pool(dsn, min_size=1, max_size=2)
    store = JobStore(pool)
    try:
        again = JobSubmission(queue="q", type="t", idempotency_key="k0", limit_keys=["tenant:1"])
        replayed = await store.submit(again)
        assert not replayed.created and replayed.job["id"] == ids["COMPLETED"]  # an old key
        fresh = (await store.submit(JobSubmission(queue="q", type="t"))).job
        seq = await pool.fetchval("SELECT submit_seq FROM evora.jobs WHERE id = $1", fresh["id"])
        assert seq == sequences["jobs_submit_seq_seq"] + 1
        claimed = await store.claim(worker_id="w2", queues=["q"], max_jobs=10)
        assert {j["id"] for j in claimed} == {ids["PENDING"], fresh["id"]}
        # the attempt the previous release started ends with the lease it handed out
        token = await pool.fetchval(
            "SELECT lease_token FROM evora.jobs WHERE id = $1", ids["RUNNING"]
        )
        await store.complete(ids["RUNNING"], token, None)
        # its dependent, WAITING before the move, is settled by the moved triggers
        assert (await store.get(ids["WAITING"]))["state"] == "PENDING"
        for job in claimed:
            await store.complete(job["id"], job["lease_token"], None)
        events: list[dict[str, Any]] = await store.events(fresh["id"])
        assert [e["event"] for e in events] == ["submitted", "claimed", "completed"]
        assert await store.traceparents([ids["traced"]]) != {}
    finally:
        await store.close()
        await pool.close()


def test_no_product_statement_names_a_table_unqualified() -> None:
    """Every table of Evora's is named `evora.<table>` in the statements and the function
    files, so nothing depends on a session's search_path (which a transaction pooler does
    not carry)."""
    tables = {line.split()[1] for line in drift.expected_objects() if line.startswith("table ")}
    bare = "|".join(t.removeprefix("evora.") for t in sorted(tables))
    pattern = re.compile(
        rf"\b(FROM|JOIN|UPDATE|INTO|TABLE|TRUNCATE|ONLY|REFERENCES|ON)\s+({bare})\b(?!\.)",
        re.IGNORECASE,
    )
    storage = REPO / "shared/evora/storage"
    found: list[str] = []
    for path in sorted([*storage.glob("sql/*.sql"), *storage.glob("functions/*.sql")]):
        for n, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            code = line.split("--", 1)[0]
            if pattern.search(code):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert found == []
