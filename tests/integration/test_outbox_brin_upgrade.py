"""The upgrade to a BRIN index on job_events' seq (migration 0059): a database at 0058, migrated
and filled with history by that release's own code, migrates; the primary key is gone from the
parent and every partition, the BRIN index is on each of them (and on a partition made
afterwards); the previous release's projector statement, which fetches its batch by
`seq = ANY(...)`, keeps the read models right on the new schema while it is rolled, and this
release's reads on from its checkpoint; the auditor reads the whole history."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

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
from tests.conftest import Clock
from tests.projector.conftest import catch_up, without_target_writes
from tests.projector.test_projection import assert_matches_truth
from tests.projector.workload import mixed_workload
from tests.release_tree import (
    CODE_ROOTS,
    HISTORY_WITH_RUNNING_JOBS,
    run_release_script,
    unpack_release,
)

BEFORE = 58
# main with migration 0058 its newest: the code that ran before the BRIN index on seq.
BEFORE_BRIN = "4954fa6"
QUEUES = ["alpha", "beta"]
# The table of job_events' rows: itself at 0058, `job_event_rows` from migration 0064 on (where
# `job_events` is a view over it and the statement batches).
ROWS = "coalesce(to_regclass('evora.job_event_rows'), 'evora.job_events'::regclass)"
# Per index of that table and of its partitions: its access method and whether it is unique.
EVENT_INDEXES = f"""
SELECT c.relname, a.amname, i.indisunique, i.indisprimary
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_am a ON a.oid = c.relam
WHERE i.indrelid = {ROWS}
   OR i.indrelid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = {ROWS})
"""
PARTITIONS = f"SELECT count(*) FROM pg_inherits WHERE inhparent = {ROWS}"


def _indexes(rows: list[Any]) -> set[tuple[str, bool, bool]]:
    """(access method, unique, primary) of the indexes on seq alone or (seq, at)."""
    return {
        (r["amname"], r["indisunique"], r["indisprimary"])
        for r in rows
        if r["relname"].endswith(("_pkey", "_seq", "_seq_idx")) and "xid" not in r["relname"]
    }


async def test_the_previous_projector_reads_right_through_the_upgrade_and_this_one_reads_on(
    empty_db_url: str,
    mongo: AsyncDatabase[Document],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tree = unpack_release(BEFORE_BRIN, tmp_path / "before", (*CODE_ROOTS, "tests"))
    running = await run_release_script(tree, HISTORY_WITH_RUNNING_JOBS, empty_db_url, "5", *QUEUES)
    assert running
    previous_read_batch = parse((tree / "shared/evora/storage/sql/outbox.sql").read_text())[
        "read_batch"
    ]
    assert "seq = ANY" in previous_read_batch
    # This release's reader takes from each read the PostgreSQL history it was made on
    # (outbox.HistoryChanged), which the previous statement did not return: this release's
    # column is added to it, the rest runs as it was.
    assert previous_read_batch.endswith(" AS target")
    previous_read_batch += ",\n" + outbox.READ_BATCH[outbox.READ_BATCH.rindex("(pg_control") :]

    pool = await create_pool(empty_db_url, min_size=1, max_size=4)
    try:
        async with pool.acquire() as conn:
            assert await current_version(conn) == BEFORE
            assert _indexes(await conn.fetch(EVENT_INDEXES)) == {("btree", True, True)}
        # the previous release's projector, part of the way before the upgrade
        monkeypatch.setattr(outbox, "READ_BATCH", previous_read_batch)
        without_target_writes(monkeypatch)
        await Projector(pool, mongo, 1, batch_size=50).run_once()
    finally:
        await pool.close()

    assert 59 in await apply_migrations(empty_db_url)

    pool = await create_pool(empty_db_url, min_size=1, max_size=4)
    try:
        store = JobStore(pool)
        rows = await pool.fetch(EVENT_INDEXES)
        assert _indexes(rows) == {("brin", False, False)}
        brin = [r for r in rows if r["amname"] == "brin"]
        assert len(brin) == 1 + await pool.fetchval(PARTITIONS)  # the parent's, each partition's
        # the jobs RUNNING across it end, new ones run; the previous projector reads on, by
        # seq through the BRIN index, and the read models match the tables
        for job_id, lease_token in running:
            await store.complete(uuid.UUID(job_id), uuid.UUID(lease_token))
        await mixed_workload(store, pool, jobs=60, queues=QUEUES, seed=6, rounds=4)
        await catch_up(Projector(pool, mongo, 1, batch_size=50))
        await assert_matches_truth(pool, mongo)
        # rolled: this release's statement reads on from the same checkpoint
        monkeypatch.undo()
        assert "seq = ANY" not in outbox.READ_BATCH
        await mixed_workload(store, pool, jobs=40, queues=QUEUES, seed=7, rounds=3)
        await catch_up(Projector(pool, mongo, 1, batch_size=50))
        await assert_matches_truth(pool, mongo)
        async with pool.acquire() as conn:
            report = await audit(conn)
        assert report.ok, report.text()
        assert report.events == await pool.fetchval("SELECT count(*) FROM evora.job_events")
    finally:
        await store.close()
        await pool.close()


async def test_a_partition_made_after_the_upgrade_has_the_brin_index(
    db_url: str, clock: Clock
) -> None:
    pool = await create_pool(db_url, min_size=1, max_size=2)
    try:
        before = await pool.fetchval(PARTITIONS)
        await clock.advance(86_400)  # the sweeper's round makes the next day's partition
        assert await pool.fetchval(PARTITIONS) > before
        rows = await pool.fetch(EVENT_INDEXES)
        assert _indexes(rows) == {("brin", False, False)}
        assert len([r for r in rows if r["amname"] == "brin"]) == 1 + await pool.fetchval(
            PARTITIONS
        )
    finally:
        await pool.close()
