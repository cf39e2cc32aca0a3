"""The upgrade to a narrow hot path (migration 0038 and evora.event_image()): a database at
0036, migrated and filled with history by that release's own code, migrates; the listing
answers every page with the same jobs, through the new indexes (newest first by id since
migration 0068); the events written before (whole images) and after (narrow ones) make one
history the auditor and the projector read whole."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from pymongo.asynchronous.database import AsyncDatabase

from evora.readmodels.layout import Document
from evora.storage.audit import audit
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations, current_version
from evora_services.projector.projector import Projector
from tests.integration.listing_pages import every_page
from tests.projector.conftest import catch_up
from tests.projector.test_projection import assert_matches_truth
from tests.projector.workload import mixed_workload
from tests.release_tree import CODE_ROOTS, run_release_script, unpack_release

BEFORE = 36
# main with migration 0036 its newest, the code that ran before the narrow hot path.
BEFORE_NARROW = "67427cb"
QUEUES = ["alpha", "beta"]
JOBS_INDEXES = (
    "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
    " WHERE i.indrelid = 'evora.jobs'::regclass AND i.indisvalid"
)


# Run by BEFORE_NARROW's own code, in a child process: migrate an empty database as that
# release does (its migrations, its function files), drive the mixed workload through its
# JobStore, and leave some jobs RUNNING across the upgrade; prints them (id and lease token)
# and every page of the listing (listing_pages.py, copied into the tree).
_BEFORE_SCRIPT = """
import asyncio, json, sys
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations
from tests.projector.workload import mixed_workload
from listing_pages import every_page

async def main(url, queues):
    await apply_migrations(url)
    pool = await create_pool(url, min_size=1, max_size=4)
    store = JobStore(pool)
    try:
        await mixed_workload(store, pool, jobs=120, queues=queues, seed=3, rounds=6)
        running = await store.claim(worker_id="across", queues=queues, max_jobs=5)
        running = [[str(j["id"]), str(j["lease_token"])] for j in running]
        print(json.dumps({"running": running, "pages": await every_page(store)}))
    finally:
        await store.close()
        await pool.close()

asyncio.run(main(sys.argv[1], sys.argv[2:]))
"""


async def _before_narrow(url: str, tree: Path) -> tuple[list[list[str]], list[Any]]:
    """BEFORE_NARROW's code on `url` (_BEFORE_SCRIPT): the jobs it left RUNNING, and the
    listing's pages."""
    shutil.copy(Path(__file__).with_name("listing_pages.py"), tree / "listing_pages.py")
    printed = await run_release_script(tree, _BEFORE_SCRIPT, url, *QUEUES)
    return printed["running"], printed["pages"]


async def test_jobs_and_history_survive_the_upgrade_and_read_alike(
    empty_db_url: str,
    mongo: AsyncDatabase[Document],
    tmp_path: Path,
) -> None:
    tree = unpack_release(BEFORE_NARROW, tmp_path / "before", (*CODE_ROOTS, "tests"))
    running, before = await _before_narrow(empty_db_url, tree)
    assert running
    pool = await create_pool(empty_db_url, min_size=1, max_size=4)
    try:
        store = JobStore(pool)
        async with pool.acquire() as conn:
            assert await current_version(conn) == BEFORE
        assert {r["relname"] for r in await pool.fetch(JOBS_INDEXES)} >= {
            "jobs_listing",
            "jobs_submit_seq",
        }
    finally:
        await store.close()
        await pool.close()

    assert 38 in await apply_migrations(empty_db_url)

    pool = await create_pool(empty_db_url, min_size=1, max_size=4)
    try:
        store = JobStore(pool)
        # This release's projector reads the outbox's tables of migration 0064 (statement
        # batches beside the rows): it starts after the upgrade, part of the way through the
        # history written before it, and reads on through what comes after.
        projector = Projector(pool, mongo, 1, batch_size=50)
        await projector.run_once()
        indexes = {r["relname"] for r in await pool.fetch(JOBS_INDEXES)}
        assert "jobs_listing" not in indexes
        assert indexes >= {"jobs_listing_by_id"}
        # the release before listed by submit_seq, this one by id (migration 0068): the
        # same jobs, those made within a millisecond by that release's random ids in the
        # ids' order
        assert await every_page(store) == [
            sorted(listed, key=lambda job: uuid.UUID(job[0]), reverse=True) for listed in before
        ]
        # the jobs RUNNING across it end under the narrow events, new ones run through
        for job_id, lease_token in running:
            await store.complete(uuid.UUID(job_id), uuid.UUID(lease_token))
        await mixed_workload(store, pool, jobs=60, queues=QUEUES, seed=4, rounds=4)
        shapes = await pool.fetch(
            "SELECT (job).id IS NOT NULL AS whole, count(*) AS n FROM evora.job_events"
            " WHERE event <> 'submitted' GROUP BY 1"
        )
        assert {r["whole"] for r in shapes} == {True, False}
        async with pool.acquire() as conn:
            report = await audit(conn)
        assert report.ok, report.text()
        projector = Projector(pool, mongo, 1, batch_size=50)
        await catch_up(projector)
        await assert_matches_truth(pool, mongo)
    finally:
        await store.close()
        await pool.close()
