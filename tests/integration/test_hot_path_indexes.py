"""What a submission, a claim and a completion add to the indexes of `jobs`. A submission
inserts the row, and neither a claim nor a completion is a HOT update (both change `state`,
which the partial indexes' predicates name), so each adds an entry to every index whose
predicate the new row matches: a full index pays on every transition. The entries
are read from the WAL each one writes (pg_walinspect's block references, by relation), so the
test counts what PostgreSQL did, not what a plan says it would."""

from __future__ import annotations

from collections.abc import Awaitable

import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import Completion, JobStore


async def _indexes_written(pool: asyncpg.Pool, step: Awaitable[object]) -> set[str]:
    """The indexes of evora.jobs that `step` inserted into (a leaf insert or a page split)."""
    async with pool.acquire() as conn:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        start = await conn.fetchval("SELECT pg_current_wal_insert_lsn()::text")
        await step
        # the tests' server commits asynchronously: flush the WAL up to here, where
        # pg_walinspect reads
        end = await conn.fetchval(
            "SELECT pg_logical_emit_message(false, 'evora-test', '', true)::text"
        )
        rows = await conn.fetch(
            "SELECT DISTINCT c.relname"
            " FROM pg_get_wal_block_info($1::text::pg_lsn, $2::text::pg_lsn) b"
            " JOIN pg_class c ON c.relfilenode = b.relfilenode"
            " JOIN pg_index i ON i.indexrelid = c.oid"
            " WHERE b.reldatabase = (SELECT oid FROM pg_database"
            "                           WHERE datname = current_database())"
            "   AND i.indrelid = 'evora.jobs'::regclass"
            "   AND b.resource_manager = 'Btree'"
            "   AND (b.record_type LIKE 'INSERT%' OR b.record_type LIKE 'SPLIT%')",
            start,
            end,
        )
    return {r["relname"] for r in rows}


async def test_a_submission_a_claim_and_a_completion_enter_only_the_indexes_of_their_state(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    # a job due at once is in one index by due time, jobs_claimable; one due later in
    # jobs_delayed as well, which the dispatcher's next due time reads (migration 0053)
    submission = store.submit_batch([JobSubmission(queue="q", type="t")] * 20)
    assert await _indexes_written(pool, submission) == {
        "jobs_pkey",
        "jobs_claimable",
        "jobs_listing_at_rest",
        "jobs_submit_seq",
    }
    later = store.submit_batch([JobSubmission(queue="q", type="t", delay_seconds=60)])
    assert await _indexes_written(pool, later) == {
        "jobs_pkey",
        "jobs_claimable",
        "jobs_delayed",
        "jobs_listing_at_rest",
        "jobs_submit_seq",
    }
    claimed: list[dict[str, object]] = []

    async def claim() -> None:
        claimed.extend(await store.claim(worker_id="w", queues=["q"], max_jobs=20))

    assert await _indexes_written(pool, claim()) == {
        "jobs_pkey",
        "jobs_running_lease",
        "jobs_submit_seq",
    }
    assert len(claimed) == 20
    completions = [Completion(j["id"], j["lease_token"]) for j in claimed]  # type: ignore[arg-type]
    assert await _indexes_written(pool, store.complete_many(completions)) == {
        "jobs_pkey",
        "jobs_finished",
        "jobs_listing_at_rest",
        "jobs_submit_seq",
    }
