"""The upgrade to references removed per statement (migration 0061): a database migrated to
0060 by that release's own code, holding finished jobs with callbacks, dependency edges, trace
contexts and spawned children, migrates; nothing of it is lost, the four foreign keys are gone,
and retention then removes each pruned job's rows with it (the trigger jobs_references_removed)
while the rows of jobs that stay remain."""

from __future__ import annotations

from pathlib import Path

from evora.protocol.states import JobState
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations, available, current_version
from evora.storage.retention import RetentionStore
from tests.conftest import Clock
from tests.release_tree import run_release_script, unpack_release
from tests.sweeper.test_retention import DAY, add_references, finished, references

BEFORE = 60
# main with migration 0060 its newest: the release before the foreign keys were replaced.
BEFORE_TRIGGER = "384d167"

_MIGRATE = """
import asyncio, json, sys
from evora.storage.migrate import apply_migrations
print(json.dumps(asyncio.run(apply_migrations(sys.argv[1]))))
"""

FOREIGN_KEYS = (
    "SELECT count(*) FROM pg_constraint WHERE contype = 'f' AND confrelid = 'evora.jobs'::regclass"
)


async def test_references_survive_the_upgrade_and_go_with_their_jobs_after_it(
    pg_server_url: str, empty_db_url: str, tmp_path: Path
) -> None:
    tree = unpack_release(BEFORE_TRIGGER, tmp_path / "release")
    assert max(await run_release_script(tree, _MIGRATE, empty_db_url)) == BEFORE

    pool = await create_pool(empty_db_url, min_size=1, max_size=4)
    try:
        async with pool.acquire() as conn:
            assert await current_version(conn) == BEFORE
            assert await conn.fetchval(FOREIGN_KEYS) == 4
        store = JobStore(pool)
        clock = Clock(pg_server_url, empty_db_url, renew=[pool])
        old = await finished(store, "refs", JobState.COMPLETED, 4, "old")
        await clock.advance(2 * DAY)
        young = await finished(store, "refs", JobState.COMPLETED, 2, "young")
        await add_references(pool, old + young)
        before = await references(pool, old + young)
    finally:
        await pool.close()

    assert await apply_migrations(empty_db_url) == [
        m.version for m in available() if m.version > BEFORE
    ]

    pool = await create_pool(empty_db_url, min_size=1, max_size=4)
    try:
        assert await pool.fetchval(FOREIGN_KEYS) == 0
        assert await references(pool, old + young) == before
        assert await RetentionStore(pool).prune_finished(JobState.COMPLETED, DAY, 100) == len(old)
        assert await references(pool, old) == dict.fromkeys(before, 0)
        assert await references(pool, young) == dict.fromkeys(before, len(young))
    finally:
        await pool.close()
