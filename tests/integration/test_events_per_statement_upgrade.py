"""The upgrade to events per statement (migration 0064): a database at 0063, migrated and filled
with history by that release's own code, migrates; every event written before reads back as
it was through the `job_events` view; the hot transitions write statement batches from then
on; the previous release's projector statement, which reads `job_events` itself, keeps the
read models right while it is rolled, and this release's reads on from its checkpoint; the
auditor reads the whole history, rows and batches, as one."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pymongo.asynchronous.database import AsyncDatabase

from evora.readmodels.layout import Document
from evora.storage import outbox
from evora.storage.audit import audit
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations, current_version
from evora.storage.statements import parse
from evora_services.projector.projector import Projector
from tests.projector.conftest import catch_up
from tests.projector.test_projection import assert_matches_truth
from tests.projector.workload import mixed_workload
from tests.release_tree import (
    CODE_ROOTS,
    HISTORY_WITH_RUNNING_JOBS,
    run_release_script,
    unpack_release,
)

BEFORE = 63
# main with migration 0063 its newest: the code that wrote every event as a row.
BEFORE_BATCHES = "2ac0c64"
QUEUES = ["alpha", "beta"]
EVENTS = "SELECT * FROM evora.job_events WHERE seq <= $1 ORDER BY seq"
# a role of the cluster's, named apart from other tests' (roles are not per database)
REPORTER = f"reporter_{uuid.uuid4().hex[:12]}"


async def test_the_history_reads_alike_and_both_projectors_read_through_the_upgrade(
    empty_db_url: str,
    mongo: AsyncDatabase[Document],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree = unpack_release(BEFORE_BATCHES, tmp_path / "before", (*CODE_ROOTS, "tests"))
    running = await run_release_script(tree, HISTORY_WITH_RUNNING_JOBS, empty_db_url, "8", *QUEUES)
    assert running
    previous_read_batch = parse((tree / "shared/evora/storage/sql/outbox.sql").read_text())[
        "read_batch"
    ]
    assert "FROM evora.job_events e" in previous_read_batch

    pool = await create_pool(empty_db_url, min_size=1, max_size=4)
    try:
        async with pool.acquire() as conn:
            assert await current_version(conn) == BEFORE
            last = await conn.fetchval("SELECT max(seq) FROM evora.job_events")
            before = [dict(r) for r in await conn.fetch(EVENTS, last)]
            # an operator's reporting role, let read the table
            await conn.execute(
                f"CREATE ROLE {REPORTER}; GRANT USAGE ON SCHEMA evora TO {REPORTER};"
                f" GRANT SELECT ON evora.job_events TO {REPORTER}"
            )
        # the previous release's projector, part of the way before the upgrade
        monkeypatch.setattr(outbox, "READ_BATCH", previous_read_batch)
        await Projector(pool, mongo, 1, batch_size=50).run_once()
    finally:
        await pool.close()

    assert 64 in await apply_migrations(empty_db_url)

    pool = await create_pool(empty_db_url, min_size=1, max_size=4)
    try:
        store = JobStore(pool)
        assert [dict(r) for r in await pool.fetch(EVENTS, last)] == before
        assert await pool.fetchval("SELECT count(*) FROM evora.event_batches") == 0
        # the reporting role reads the view as it read the table
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(f"SET LOCAL ROLE {REPORTER}")
            assert await conn.fetchval("SELECT count(*) FROM evora.job_events") == len(before)
        # the jobs RUNNING across it end, new ones run: their claims and completions are
        # statement batches, numbered after the old history
        for job_id, lease_token in running:
            await store.complete(uuid.UUID(job_id), uuid.UUID(lease_token))
        await mixed_workload(store, pool, jobs=60, queues=QUEUES, seed=9, rounds=4)
        assert await pool.fetchval("SELECT min(seq) > $1 FROM evora.event_batches", last)
        assert await pool.fetchval(
            "SELECT count(*) FROM evora.event_batches WHERE 'completed' = ANY(events)"
        )
        # the previous projector reads on through the view, and the read models match
        await catch_up(Projector(pool, mongo, 1, batch_size=50))
        await assert_matches_truth(pool, mongo)
        # rolled: this release's statement reads on from the same checkpoint
        monkeypatch.undo()
        assert "evora.event_batches" in outbox.READ_BATCH
        await mixed_workload(store, pool, jobs=40, queues=QUEUES, seed=10, rounds=3)
        await catch_up(Projector(pool, mongo, 1, batch_size=50))
        await assert_matches_truth(pool, mongo)
        async with pool.acquire() as conn:
            report = await audit(conn)
        assert report.ok, report.text()
        assert report.events == await pool.fetchval("SELECT count(*) FROM evora.job_events")
    finally:
        await store.close()
        await pool.close()
