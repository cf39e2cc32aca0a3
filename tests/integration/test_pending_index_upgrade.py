"""The upgrade that takes jobs due at once out of the index by due time (migration 0053:
jobs_scheduled gives way to jobs_delayed): a database at 0048, migrated and filled by that
release's own code with delayed and due jobs of several priorities, migrates; the next due
time (through jobs_delayed) and the oldest due job (through jobs_claimable) answer what the
jobs say, and so do the previous release's statements on the new schema
(a rolling upgrade runs them); jobs RUNNING across the upgrade end, new ones run, and the
audit finds nothing."""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from evora.storage.audit import audit
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations, current_version
from evora.storage.outbox import oldest_due
from tests.projector.workload import mixed_workload
from tests.release_tree import CODE_ROOTS, run_release_script, unpack_release

BEFORE = 48
# main with migration 0048 its newest, the code that ran before jobs_scheduled was dropped.
BEFORE_ONE_INDEX = "16cf4e6"
QUEUES = ["alpha", "beta"]

# Run by BEFORE_ONE_INDEX's own code, in a child process. "fill": migrate an empty database
# as that release does, drive the mixed workload through its JobStore, submit delayed jobs of
# several priorities, leave some jobs RUNNING across the upgrade (printed: id and lease
# token) and due ones PENDING. "read": what its next_due and oldest_due answer for each queue.
_BEFORE_SCRIPT = """
import asyncio, json, sys
from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations
from evora.storage.outbox import oldest_due
from tests.projector.workload import mixed_workload

async def main(mode, url, queues):
    if mode == "fill":
        await apply_migrations(url)
    pool = await create_pool(url, min_size=1, max_size=4)
    store = JobStore(pool)
    try:
        if mode == "fill":
            await mixed_workload(store, pool, jobs=120, queues=queues, seed=5, rounds=6)
            await store.submit_batch([
                JobSubmission(queue=q, type="later", priority=p, delay_seconds=d)
                for q in queues for p, d in ((-2, 7200), (0, 900), (4, 3600), (9, 1800))])
            running = await store.claim(worker_id="across", queues=queues, max_jobs=5)
            await store.submit_batch([
                JobSubmission(queue=q, type="due", priority=p) for q in queues for p in (3, 6)])
            print(json.dumps([[str(j["id"]), str(j["lease_token"])] for j in running]))
        else:
            due = {q: await store.seconds_until_due([q]) for q in queues}
            oldest = {q: t and t.isoformat() for q, t in (await oldest_due(pool, queues)).items()}
            print(json.dumps({"due": due, "oldest": oldest}))
    finally:
        await store.close()
        await pool.close()

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
"""


async def _before(tree: Path, mode: str, url: str) -> Any:
    """BEFORE_ONE_INDEX's code on `url` (_BEFORE_SCRIPT in `mode`): what it printed."""
    return await run_release_script(tree, _BEFORE_SCRIPT, mode, url, *QUEUES)


async def _truth(pool: asyncpg.Pool, queue: str) -> tuple[datetime | None, datetime | None]:
    """The next delayed and the oldest due PENDING job of `queue`, read without any index."""
    row = await pool.fetchrow(
        "SELECT min(run_at) FILTER (WHERE run_at > evora.clock_now()) AS next,"
        "       min(run_at) FILTER (WHERE run_at <= evora.clock_now()) AS oldest"
        " FROM evora.jobs WHERE state = 'PENDING' AND queue = $1",
        queue,
    )
    assert row is not None
    return row["next"], row["oldest"]


async def test_the_due_times_read_alike_before_and_after_the_upgrade(
    empty_db_url: str, tmp_path: Path
) -> None:
    tree = unpack_release(BEFORE_ONE_INDEX, tmp_path / "before", (*CODE_ROOTS, "tests"))
    running = await _before(tree, "fill", empty_db_url)
    assert isinstance(running, list) and running
    pool = await create_pool(empty_db_url, min_size=1, max_size=4)
    try:
        async with pool.acquire() as conn:
            assert await current_version(conn) == BEFORE
        assert await pool.fetchval("SELECT to_regclass('evora.jobs_scheduled') IS NOT NULL")
    finally:
        await pool.close()

    assert 53 in await apply_migrations(empty_db_url)

    pool = await create_pool(empty_db_url, min_size=1, max_size=4)
    store = JobStore(pool)
    try:
        assert await pool.fetchval(
            "SELECT to_regclass('evora.jobs_scheduled') IS NULL"
            " AND to_regclass('evora.jobs_delayed') IS NOT NULL"
        )
        now = await pool.fetchval("SELECT evora.clock_now()")
        previous = await _before(tree, "read", empty_db_url)
        assert isinstance(previous, dict)
        oldest = await oldest_due(pool, QUEUES)
        assert all(oldest.values())
        for queue in QUEUES:
            next_at, oldest_at = await _truth(pool, queue)
            assert next_at is not None
            for due in (await store.seconds_until_due([queue]), previous["due"][queue]):
                assert abs((next_at - now).total_seconds() - due) < 30
            assert oldest[queue] == oldest_at
            assert previous["oldest"][queue] == (oldest_at and oldest_at.isoformat())
        # the jobs RUNNING across it end, new ones run through
        for job_id, lease_token in running:
            await store.complete(uuid.UUID(job_id), uuid.UUID(lease_token))
        await mixed_workload(store, pool, jobs=60, queues=QUEUES, seed=6, rounds=4)
        async with pool.acquire() as conn:
            report = await audit(conn)
        assert report.ok, report.text()
    finally:
        await store.close()
        await pool.close()
