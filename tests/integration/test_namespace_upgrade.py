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
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID, uuid4

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
# its stores: a limit and its history, a schedule, a paused queue, what the projector and the
# archiver would record, and (argument `jobs`) jobs in every state (with events, idempotency
# keys, dependencies, limit keys, a group and a trace). Prints the ids of the jobs, by the
# state they end in.
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
    def sub(**fields):
        return JobSubmission(**{"queue": "q", "type": "t", **fields})
    await LimitStore(pool).put("tenant:*", LimitSpec(concurrency=5, rate=None))
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
    if sys.argv[2:] != ["jobs"]:
        print("{}")
        return
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
    await store.close()
    await pool.close()
    print(json.dumps({"COMPLETED": str(done), "DLQ": str(dead), "RUNNING": str(running),
                      "WAITING": str(waiting), "PENDING": str(pending),
                      "CANCELLED": str(cancelled), "traced": str(traced)}))

asyncio.run(main(sys.argv[1]))
"""

_TABLES = """
SELECT c.relnamespace::regnamespace::text AS schema, c.relname FROM pg_class c
WHERE c.relnamespace = ANY ($1::regnamespace[]) AND c.relkind IN ('r', 'p')
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


def _previous_release(shared: Path, dsn: str, *what: str) -> dict[str, UUID]:
    env = {**os.environ, "PYTHONPATH": str(shared)}
    out = subprocess.run(
        [sys.executable, "-c", _FILL, dsn, *what],
        capture_output=True,
        text=True,
        env=env,
        cwd=shared,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return {k: UUID(v) for k, v in json.loads(out.stdout.splitlines()[-1]).items()}


async def _empty_database(make_db_url: MakeDatabase, search_path: str | None) -> str:
    dsn = await make_db_url()
    conn = await asyncpg.connect(dsn)
    try:  # start from nothing, not from the migrated template
        await conn.execute(
            "DROP SCHEMA evora CASCADE; DROP SCHEMA public CASCADE; CREATE SCHEMA public"
        )
        if search_path is not None:
            await conn.execute(
                f"ALTER DATABASE {await conn.fetchval('SELECT current_database()')} "
                f"SET search_path = {search_path}"
            )
    finally:
        await conn.close()
    return dsn


async def _snapshot(
    conn: asyncpg.Connection, schemas: list[str], name: Callable[[str], str]
) -> dict[str, list[str]]:
    """Every row of every table of `schemas`, by the table's name after 0030 (`name`)."""
    rows: dict[str, list[str]] = {}
    for table in await conn.fetch(_TABLES, schemas):
        qualified = f"{table['schema']}.{table['relname']}"
        texts = await conn.fetch(f"SELECT t::text FROM {qualified} t ORDER BY t::text")
        assert name(table["relname"]) not in rows  # one table of a name
        rows[name(table["relname"])] = [r[0] for r in texts]
    return rows


async def _sequences(conn: asyncpg.Connection, schemas: list[str]) -> dict[str, int]:
    found = await conn.fetch(
        "SELECT sequencename, last_value FROM pg_sequences WHERE schemaname = ANY ($1)", schemas
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
    dsn = await _empty_database(make_db_url, None)
    ids = _previous_release(before_namespace, dsn, "jobs")
    conn = await asyncpg.connect(dsn)
    try:
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
        # an operator's reader of the jobs, granted them the way the previous release had it
        reader = f"reader_{uuid4().hex[:12]}"
        await conn.execute(f"CREATE ROLE {reader} LOGIN PASSWORD 'reader-password'")
        try:
            await conn.execute(f"GRANT SELECT ON public.jobs TO {reader}")
            sequences = await _moves_whole(conn, dsn)
            await _reads_only_jobs(dsn, reader, len(states))
        finally:
            await conn.execute(f"DROP OWNED BY {reader}")
            await conn.execute(f"DROP ROLE {reader}")
    finally:
        await conn.close()
    await _serves(dsn, ids, sequences)


async def _reads_only_jobs(dsn: str, reader: str, jobs: int) -> None:
    """`reader`, granted SELECT on `jobs` before the move, reads `evora.jobs` after it (0030
    gave it the schema's USAGE), and nothing else of Evora's."""
    parts = urlsplit(dsn)
    netloc = f"{reader}:reader-password@{parts.hostname}:{parts.port}"
    conn = await asyncpg.connect(urlunsplit(parts._replace(netloc=netloc)))
    try:
        assert await conn.fetchval("SELECT count(*) FROM evora.jobs") == jobs
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetchval("SELECT count(*) FROM evora.job_events")
    finally:
        await conn.close()


async def test_what_a_role_named_evora_migrated_moves_whole_and_serves(
    make_db_url: MakeDatabase, before_namespace: Path
) -> None:
    """Where `evora` came first in the search_path of the role that migrated (a role named
    `evora`, "$user": the docker compose and Kubernetes defaults), the previous release put
    the tables of migrations up to 0011 (which made the schema) in `public` and the later
    ones in `evora`, and the function files' functions in `evora` beside the migrations' in
    `public`. Its SQL submissions found no `jobs` there (the submitting functions search
    `evora` only), so this database holds no job."""
    dsn = await _empty_database(make_db_url, '"evora", "public"')
    _previous_release(before_namespace, dsn)
    conn = await asyncpg.connect(dsn)
    try:
        tables = await conn.fetch(_TABLES, ["public", "evora"])
        where = {t["relname"]: t["schema"] for t in tables}
        assert where["jobs"] == "public" and where["flow_limits"] == "evora", where
        await _moves_whole(conn, dsn)
    finally:
        await conn.close()
    await _serves(dsn, {}, {"jobs_submit_seq_seq": 0})


async def _moves_whole(conn: asyncpg.Connection, dsn: str) -> dict[str, int]:
    """`evora migrate` on the previous release's database at `dsn`: every row of every table
    is in `evora` afterwards, and nothing of Evora's anywhere else; the sequences as
    before, which this returns."""
    schemas = ["public", "evora"]
    assert await conn.fetchval("SELECT max(version) FROM public.evora_migrations") == (
        NAMESPACE_VERSION - 1
    )
    before = await _snapshot(conn, schemas, lambda t: _RENAMED.get(t, t))
    empty = {t for t, rows in before.items() if not rows}
    sequences = await _sequences(conn, schemas)

    # 0030 alone first: the migrations after it change rows of their own (0031 gives
    # projector_progress its snapshot), which the comparison below would count as changes
    assert NAMESPACE_VERSION in await apply_migrations(dsn, upto=NAMESPACE_VERSION)

    assert await conn.fetch(_OURS_IN_PUBLIC) == []
    after = await _snapshot(conn, ["evora"], lambda t: t)
    added = f"({NAMESPACE_VERSION},one_namespace,"
    migrations = after.pop("migrations")
    assert [m for m in migrations if not m.startswith(added)] == before.pop("migrations")
    assert sum(m.startswith(added) for m in migrations) == 1
    files_before = before.pop("function_files")
    after.pop("function_files")
    assert after == before
    assert await _sequences(conn, ["evora"]) == sequences
    await apply_migrations(dsn)
    # the function files were applied again, by this code
    files = await _snapshot(conn, ["evora"], lambda t: t)
    assert files["function_files"] != files_before
    assert await drift.drift(conn) == []
    # what the previous release filled is not empty: the comparison compared rows
    assert {"schedules", "flow_limits", "flow_limit_changes", "paused_queues"}.isdisjoint(empty)
    return sequences


async def _serves(dsn: str, ids: dict[str, UUID], sequences: dict[str, int]) -> None:
    """The current stores on the moved database: new jobs are numbered after the old ones,
    and the old jobs (`ids`, by state), if any, go on."""
    pool = await create_pool(dsn, min_size=1, max_size=2)
    store = JobStore(pool)
    try:
        fresh = (await store.submit(JobSubmission(queue="q", type="t"))).job
        # and the SQL API applications call (a role named `evora` found no `jobs` in it)
        assert await pool.fetchval("SELECT evora.submit('q2', 't')") is not None
        seq = await pool.fetchval("SELECT submit_seq FROM evora.jobs WHERE id = $1", fresh["id"])
        assert seq == sequences["jobs_submit_seq_seq"] + 1
        claimed = await store.claim(worker_id="w2", queues=["q"], max_jobs=10)
        assert {j["id"] for j in claimed} == {fresh["id"], *([ids["PENDING"]] if ids else [])}
        for job in claimed:
            await store.complete(job["id"], job["lease_token"], None)
        events: list[dict[str, Any]] = await store.events(fresh["id"])
        assert [e["event"] for e in events] == ["submitted", "claimed", "completed"]
        if not ids:
            return
        again = JobSubmission(queue="q", type="t", idempotency_key="k0", limit_keys=["tenant:1"])
        replayed = await store.submit(again)
        assert not replayed.created and replayed.job["id"] == ids["COMPLETED"]  # an old key
        # the attempt the previous release started ends with the lease it handed out
        token = await pool.fetchval(
            "SELECT lease_token FROM evora.jobs WHERE id = $1", ids["RUNNING"]
        )
        await store.complete(ids["RUNNING"], token, None)
        # its dependent, WAITING before the move, is settled by the moved triggers
        assert (await store.get(ids["WAITING"]))["state"] == "PENDING"
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
    # after a keyword, or as the next table of a comma join (`FROM a x, jobs j`)
    pattern = re.compile(
        rf"(\b(FROM|JOIN|UPDATE|INTO|TABLE|TRUNCATE|ONLY|REFERENCES|ON)\s+({bare})\b(?!\.)"
        rf"|,\s*({bare})\s+(AS\s+)?[a-z]\w*\s*(,|\)|$|WHERE\b|JOIN\b|ON\b|CROSS\b))",
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
