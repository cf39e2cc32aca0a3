"""What a submission, a claim and a completion add to the indexes of `jobs`. A submission
inserts the row, and neither a claim nor a completion is a HOT update (both change `state`,
which the partial indexes' predicates name), so each adds an entry to every index whose
predicate the new row matches: a full index pays on every transition. The entries
are read from the WAL each one writes (pg_walinspect's block references, by relation), so the
test counts what PostgreSQL did, not what a plan says it would. So are the row locks each
writes into the heap of `jobs` (Heap/LOCK records): only those the statement needs; and the
new row versions that leave their page, which the fillfactor of `jobs` keeps few."""

from __future__ import annotations

from collections.abc import Awaitable

import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import Completion, JobStore


async def _wal_blocks(pool: asyncpg.Pool, step: Awaitable[object]) -> list[asyncpg.Record]:
    """The block references of the WAL records `step` wrote into evora.jobs and its indexes:
    the relation, the record's resource manager and type, and which block of the record."""
    async with pool.acquire() as conn:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        start = await conn.fetchval("SELECT pg_current_wal_insert_lsn()::text")
        await step
        # the tests' server commits asynchronously: flush the WAL up to here, where
        # pg_walinspect reads
        end = await conn.fetchval(
            "SELECT pg_logical_emit_message(false, 'evora-test', '', true)::text"
        )
        blocks: list[asyncpg.Record] = await conn.fetch(
            "SELECT c.relname, b.start_lsn, b.block_id, b.resource_manager, b.record_type"
            " FROM pg_get_wal_block_info($1::text::pg_lsn, $2::text::pg_lsn) b"
            " JOIN pg_class c ON c.relfilenode = b.relfilenode"
            " WHERE b.reldatabase = (SELECT oid FROM pg_database"
            "                           WHERE datname = current_database())"
            "   AND (c.oid = 'evora.jobs'::regclass OR c.oid IN ("
            "        SELECT indexrelid FROM pg_index WHERE indrelid = 'evora.jobs'::regclass))",
            start,
            end,
        )
    return blocks


async def _indexes_written(pool: asyncpg.Pool, step: Awaitable[object]) -> set[str]:
    """The indexes of evora.jobs that `step` inserted into (a leaf insert or a page split)."""
    return {
        b["relname"]
        for b in await _wal_blocks(pool, step)
        if b["resource_manager"] == "Btree"
        and (b["record_type"].startswith("INSERT") or b["record_type"].startswith("SPLIT"))
    }


async def _heap_writes(pool: asyncpg.Pool, step: Awaitable[object]) -> tuple[int, int, int]:
    """What `step` wrote into the heap of evora.jobs: its LOCK records, its UPDATE records
    (one per new row version), and how many of those put the new version on another page
    than the old one (a non-HOT update names the new version's page as block 0 and, when it
    is another page, the old version's as block 1)."""
    heap = [b for b in await _wal_blocks(pool, step) if b["relname"] == "jobs"]
    locks = {b["start_lsn"] for b in heap if b["record_type"].startswith("LOCK")}
    updates = {b["start_lsn"] for b in heap if b["record_type"].startswith("UPDATE")}
    moved = {
        b["start_lsn"] for b in heap if b["record_type"].startswith("UPDATE") and b["block_id"] == 1
    }
    return len(locks), len(updates), len(moved)


async def _row_locks(pool: asyncpg.Pool, step: Awaitable[object]) -> int:
    """The row locks `step` took in evora.jobs beyond the ones heap_update takes itself: the
    heap's LOCK records, less one for each update whose new row version went to another page
    (heap_update marks the old version locked while it looks for room, and WAL-logs that as a
    LOCK record; a new version on the same page needs none)."""
    locks, _, moved = await _heap_writes(pool, step)
    return locks - moved


async def test_a_submission_a_claim_and_a_completion_enter_only_the_indexes_of_their_state(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    # a job due at once is in one index by due time, jobs_claimable; one due later in
    # jobs_delayed as well, which the dispatcher's next due time reads (migration 0053)
    submission = store.submit_batch([JobSubmission(queue="q", type="t")] * 20)
    assert await _indexes_written(pool, submission) == {
        "jobs_pkey",
        "jobs_claimable",
        "jobs_listing_by_id",
    }
    later = store.submit_batch([JobSubmission(queue="q", type="t", delay_seconds=60)])
    assert await _indexes_written(pool, later) == {
        "jobs_pkey",
        "jobs_claimable",
        "jobs_delayed",
        "jobs_listing_by_id",
    }
    claimed: list[dict[str, object]] = []

    async def claim() -> None:
        claimed.extend(await store.claim(worker_id="w", queues=["q"], max_jobs=20))

    assert await _indexes_written(pool, claim()) == {
        "jobs_pkey",
        "jobs_running_lease",
    }
    assert len(claimed) == 20
    completions = [Completion(j["id"], j["lease_token"]) for j in claimed]  # type: ignore[arg-type]
    assert await _indexes_written(pool, store.complete_many(completions)) == {
        "jobs_pkey",
        "jobs_finished",
        "jobs_listing_by_id",
    }


async def test_only_the_claim_locks_a_row_before_updating_it(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    # The claim's FOR UPDATE SKIP LOCKED is its concurrency: one row lock per job it takes,
    # and its UPDATE adds none. A completion and a heartbeat lock nothing before their UPDATE,
    # which fences them by itself (it re-checks its quals on the newest version of a row
    # another transaction changed). A BEFORE UPDATE row trigger on jobs would lock every row
    # first, a LOCK record each (issue #33: 206 B of WAL per drained job were LOCK records).
    await store.submit_batch([JobSubmission(queue="q", type="t")] * 20)
    claimed: list[dict[str, object]] = []

    async def claim() -> None:
        claimed.extend(await store.claim(worker_id="w", queues=["q"], max_jobs=20))

    claim_locks = await _row_locks(pool, claim())
    assert len(claimed) == 20
    beat = store.heartbeat(claimed[0]["id"], claimed[0]["lease_token"])  # type: ignore[arg-type]
    beat_locks = await _row_locks(pool, beat)
    completions = [Completion(j["id"], j["lease_token"]) for j in claimed]  # type: ignore[arg-type]
    completion_locks = await _row_locks(pool, store.complete_many(completions))
    assert (claim_locks, beat_locks, completion_locks) == (20, 0, 0)


async def test_a_claim_and_a_completion_write_their_row_beside_the_old_one(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    # Submissions fill a page of jobs only half (fillfactor 50, migration 0069), so the
    # versions a claim and a completion write find room on their row's page: such an update
    # WAL-logs only the bytes it changed and no lock of the old version. On full pages most
    # of them moved, writing the whole row and a Heap/LOCK record each. 300 jobs fill 9 whole
    # pages, or take 18 half pages.
    for _ in range(3):
        await store.submit_batch([JobSubmission(queue="q", type="t")] * 100)
    pages = await pool.fetchval("SELECT count(DISTINCT (ctid::text::point)[0]) FROM evora.jobs")
    assert pages >= 5
    claimed: list[dict[str, object]] = []

    async def claim() -> None:
        for _ in range(3):
            claimed.extend(await store.claim(worker_id="w", queues=["q"], max_jobs=100))

    _, claims, claims_moved = await _heap_writes(pool, claim())
    assert (claims, len(claimed)) == (300, 300)
    completions = [Completion(j["id"], j["lease_token"]) for j in claimed]  # type: ignore[arg-type]
    _, done, done_moved = await _heap_writes(pool, store.complete_many(completions))
    assert done == 300
    # A page's rows grow when claimed (a lease, a worker, a start), so some overflow: 36
    # claims and 49 completions moved here, against 246 claims on full pages.
    assert claims_moved <= 300 // 3, (claims_moved, done_moved)
    assert done_moved <= 300 // 3, (claims_moved, done_moved)
