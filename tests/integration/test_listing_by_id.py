"""The admin listing pages by the job's id, and jobs_submit_seq is gone (migration 0068): jobs
list in the order they were submitted whichever way they came in; a listing paged while jobs
are submitted and move between states lists each job once; and the upgrade from the release
before with a `jobs` too large to index in the migration's transaction, whose index
`evora migrate` builds CONCURRENTLY afterwards while the queue goes on."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any, cast

import asyncpg
import pytest

from evora import sql_enqueue as sql
from evora.config import Settings
from evora.protocol.jobs import JobSubmission
from evora.storage import listing, queries
from evora.storage.audit import audit
from evora.storage.db import create_pool
from evora.storage.drift import drift
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations, unfinished_index_builds
from evora_services.cli.doctor import run_checks
from tests.integration.held_builds import migrate_past_an_open_transaction
from tests.polling import until
from tests.release_tree import CODE_ROOTS, run_release_script, schema_version, unpack_release

BEFORE = 67
# main with migration 0067 its newest: the code that listed jobs by submit_seq
BEFORE_BY_ID = "08f19eb"
JOBS_INDEXES = (
    "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
    " WHERE i.indrelid = 'evora.jobs'::regclass"
)


def _sub(queue: str = "l") -> JobSubmission:
    return JobSubmission(queue=queue, type="t")


async def _listed(store: JobStore, limit: int, **filters: Any) -> list[uuid.UUID]:
    """Every job of the listing, page after page of `limit`."""
    seen: list[uuid.UUID] = []
    after: uuid.UUID | int | None = None
    while True:
        page = await store.list_jobs(**filters, limit=limit, after=after)
        seen += [j["id"] for j in page.jobs]
        if page.next_after is None:
            return seen
        after = page.next_after


async def test_jobs_list_in_the_order_they_were_submitted_whichever_way_they_came_in(
    store: JobStore, plain_conn: asyncpg.Connection
) -> None:
    made: list[uuid.UUID] = []
    for _ in range(4):
        made += [s.id for s in await store.submit_batch([_sub()] * 60, with_jobs=False)]
        made += await sql.submit_batch(plain_conn, [{"queue": "l", "type": "t"}] * 40)
        made.append(await sql.submit(plain_conn, "l", "t"))
        made.append((await store.submit(_sub())).job["id"])
    assert made == sorted(made)
    # the database's ids (evora.uuid7()) are UUIDv7s as the api's are
    assert {i.version for i in made} == {7}
    assert {i.variant for i in made} == {uuid.RFC_4122}
    assert await _listed(store, 17, queue="l") == made[::-1]
    # RUNNING jobs (read apart) and jobs at rest merge into the same order
    running = await store.claim(worker_id="w", queues=["l"], max_jobs=30)
    assert len(running) == 30
    assert await _listed(store, 23, queue="l") == made[::-1]
    assert await _listed(store, 9) == made[::-1]
    ran = {j["id"] for j in running}
    assert await _listed(store, 7, queue="l", state="RUNNING") == [
        i for i in made[::-1] if i in ran
    ]


async def test_a_cursor_of_the_release_before_goes_on_where_it_stopped(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    made = [s.id for s in await store.submit_batch([_sub()] * 10, with_jobs=False)]
    seqs = {
        r["id"]: r["submit_seq"] for r in await pool.fetch("SELECT id, submit_seq FROM evora.jobs")
    }
    # that release's cursor was the submit_seq of the page's last job: the next page starts
    # below it
    page = await store.list_jobs(queue="l", limit=3, after=seqs[made[6]])
    assert [j["id"] for j in page.jobs] == [made[5], made[4], made[3]]
    assert page.next_after == made[3]
    # the job it names deleted since (retention): the listing goes on below where it was
    assert (await store.cancel(made[6])).immediate
    assert await pool.fetchval("SELECT evora.prune_finished(0, 10, 'CANCELLED')") == 1
    page = await store.list_jobs(queue="l", limit=50, after=seqs[made[6]])
    assert [j["id"] for j in page.jobs] == made[5::-1]
    assert page.next_after is None
    # below every job: the end
    page = await store.list_jobs(limit=5, after=seqs[made[0]])
    assert page.jobs == [] and page.next_after is None


# 100,000 jobs stored 10 ms of id apart, in id order but for every seventh, whose id is 30 ms
# older than its place (made by a clock behind, or stored late): straight into jobs, as if
# submitted over 17 minutes.
_LOAD_SKEWED = """
INSERT INTO evora.jobs (id, queue, type, payload, max_attempts, lease_seconds, run_at)
SELECT (lpad(to_hex(1800000000000 + n * 10 - CASE WHEN n % 7 = 0 THEN 30 ELSE 0 END), 12, '0')
        || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
       'l', 't', '{}', 3, 60, now()
FROM generate_series(1, $1) AS n
CROSS JOIN LATERAL md5(n::text) AS h
ORDER BY n
"""


class _Explained:
    """A connection that runs each statement also under EXPLAIN (ANALYZE, BUFFERS) and adds
    up the buffers it touched."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.buffers = 0
        self.statements = 0

    async def _explain(self, query: str, args: tuple[object, ...]) -> None:
        # the pool decodes json: the plan comes as a list
        explained = await self.conn.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, *args
        )
        plan = explained[0]["Plan"]
        self.buffers += plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
        self.statements += 1

    async def fetchrow(self, query: str, *args: object) -> asyncpg.Record | None:
        await self._explain(query, args)
        return await self.conn.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: object) -> object:
        await self._explain(query, args)
        return await self.conn.fetchval(query, *args)


async def test_a_cursor_of_the_release_before_is_resumed_without_reading_the_table(
    pool: asyncpg.Pool,
) -> None:
    """No index orders jobs by submit_seq: the resume bisects the ids with primary-key probes
    and reads only the jobs around where the submit_seqs pass the cursor's, and still finds
    exactly the newest job below it, also where ids and submit_seqs disagree a little."""
    await pool.execute(_LOAD_SKEWED, 100_000)
    await pool.execute("VACUUM ANALYZE evora.jobs")
    pages = await pool.fetchval("SELECT relpages FROM pg_class WHERE oid = 'evora.jobs'::regclass")
    seqs = await pool.fetch("SELECT submit_seq FROM evora.jobs ORDER BY id")
    lowest = seqs[0]["submit_seq"]
    async with pool.acquire() as conn:
        for seq in (lowest, lowest + 1, lowest + 7, lowest + 50_000, lowest + 99_999, 2**62):
            exact = await conn.fetchval(
                "SELECT id FROM evora.jobs WHERE submit_seq < $1 ORDER BY submit_seq DESC LIMIT 1",
                seq,
            )
            counted = _Explained(conn)
            assert await listing.resumed_after_seq(cast(asyncpg.Connection, counted), seq) == exact
            # 49 statements at most; the window holds 4 s of ids, 400 of these jobs, on
            # about 24 of the table's pages
            assert counted.statements <= 49
            assert counted.buffers < pages / 5, (seq, counted.buffers, pages)


async def test_a_listing_paged_while_jobs_come_and_move_lists_each_job_once(
    store: JobStore,
) -> None:
    """Concurrent submitters, claimers and completers move jobs between the two branches of
    the listing (at rest and RUNNING) while it is paged: every job that was there before the
    paging began is listed exactly once, in order."""
    there = [s.id for s in await store.submit_batch([_sub()] * 400, with_jobs=False)]
    stop = asyncio.Event()

    async def submitting() -> None:
        while not stop.is_set():
            await store.submit_batch([_sub()] * 5, with_jobs=False)
            await asyncio.sleep(0)

    async def working() -> None:
        while not stop.is_set():
            claimed = await store.claim(worker_id="w", queues=["l"], max_jobs=7)
            for job in claimed[::2]:
                await store.complete(job["id"], job["lease_token"])
            await asyncio.sleep(0)

    movers = [asyncio.create_task(f()) for f in (submitting, working, working)]
    try:
        for _ in range(3):
            seen = await _listed(store, 11, queue="l")
            assert len(seen) == len(set(seen))
            assert seen == sorted(seen, reverse=True)
            assert [i for i in seen if i <= there[-1]] == there[::-1]
    finally:
        stop.set()
        await asyncio.gather(*movers)
    moved = await store.pool.fetchval(
        "SELECT count(*) FROM evora.jobs WHERE state <> 'PENDING' AND id = ANY($1)", there
    )
    assert moved > 0


async def test_the_migration_waits_for_a_writer_that_read_jobs_instead_of_deadlocking(
    empty_db_url: str,
) -> None:
    """A transaction of a running service reads `jobs`, then writes it while the migration
    (on a small `jobs`, in its transaction) wants the table: the migration's lock waits for
    it, the writer goes on, nothing deadlocks. Built as index then drops, the migration held
    the build's SHARE lock while it waited for ACCESS EXCLUSIVE, and the writer's next
    statement closed the cycle (the rolling upgrade's test failed so)."""
    await apply_migrations(empty_db_url, upto=BEFORE)
    writer = await asyncpg.connect(empty_db_url)
    watcher = await asyncpg.connect(empty_db_url)
    try:
        in_progress = writer.transaction()
        await in_progress.start()
        await writer.fetchval("SELECT count(*) FROM evora.jobs")
        migrating = asyncio.create_task(apply_migrations(empty_db_url))

        async def waiting_for_jobs() -> bool:
            waiting: bool = await watcher.fetchval(
                "SELECT EXISTS (SELECT FROM pg_locks WHERE relation = 'evora.jobs'::regclass"
                " AND mode = 'AccessExclusiveLock' AND NOT granted)"
            )
            return waiting

        await until(waiting_for_jobs, "the migration waiting for its lock on jobs")
        # The write queues behind the migration's lock request until PostgreSQL's deadlock
        # check (after deadlock_timeout) lets it go ahead of it; had the migration held a lock
        # the write needs, that check would find a cycle and roll the writer back instead.
        await writer.execute("UPDATE evora.jobs SET priority = priority WHERE false")
        await in_progress.commit()
        assert 68 in await migrating
    finally:
        await watcher.close()
        await writer.close()
    conn = await asyncpg.connect(empty_db_url)
    try:
        assert await drift(conn) == []
    finally:
        await conn.close()


# Run by BEFORE_BY_ID's own code, in a child process: migrate an empty database as that
# release does, fill `jobs` past what the migration indexes at once (8 MB), leave some jobs
# RUNNING and some COMPLETED, and print every job's (id, state) in its listing's order, and
# the cursor (a submit_seq) its listing gave after the first page of 5.
_BEFORE_SCRIPT = """
import asyncio, json, sys
from evora.protocol.jobs import JobSubmission
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.migrate import apply_migrations

async def main(url):
    await apply_migrations(url)
    pool = await create_pool(url, min_size=1, max_size=4)
    store = JobStore(pool)
    try:
        pad = "x" * 900
        for n in range(12):
            await store.submit_batch(
                [JobSubmission(queue="l" if i % 3 else "m", type="t", payload={"pad": pad})
                 for i in range(1000)], with_jobs=False)
        running = await store.claim(worker_id="w", queues=["l"], max_jobs=40)
        for job in running[:20]:
            await store.complete(job["id"], job["lease_token"])
        listed, after = [], None
        while True:
            page = await store.list_jobs(limit=500, after=after)
            listed += [[str(j["id"]), str(j["state"])] for j in page.jobs]
            if page.next_after is None:
                break
            after = page.next_after
        first = await store.list_jobs(queue="l", limit=5)
        print(json.dumps({"listed": listed, "cursor": first.next_after,
                          "first": [str(j["id"]) for j in first.jobs]}))
    finally:
        await store.close()
        await pool.close()

asyncio.run(main(sys.argv[1]))
"""


async def _keep_submitting(store: JobStore, going: asyncio.Event, stop: asyncio.Event) -> int:
    """Submit small batches one after another until `stop` (`going` once 10 are in)."""
    batches = 0
    while not stop.is_set():
        await store.submit_batch([_sub()] * 3, with_jobs=False)
        batches += 1
        if batches == 10:
            going.set()
    return batches


async def test_the_upgrade_builds_the_listing_s_index_concurrently_after_the_migration(
    empty_db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tree = unpack_release(BEFORE_BY_ID, tmp_path / "before", CODE_ROOTS)
    before = await run_release_script(tree, _BEFORE_SCRIPT, empty_db_url)
    assert await schema_version(empty_db_url) == BEFORE
    listed_before = sorted(before["listed"], key=lambda job: uuid.UUID(job[0]), reverse=True)
    conn = await asyncpg.connect(empty_db_url)
    holder = await asyncpg.connect(empty_db_url)
    pool = await create_pool(empty_db_url, min_size=1, max_size=4)
    store = JobStore(pool)
    try:
        assert await conn.fetchval("SELECT pg_total_relation_size('evora.jobs')") > 8 << 20
        # a transaction open since before the build: CREATE INDEX CONCURRENTLY waits for it
        applied, held = await migrate_past_an_open_transaction(empty_db_url, holder, caplog)
        assert 68 in applied
        # migrated; the index is not built (the build that gave up left it invalid), the two
        # it replaces are there, and the listing is right meanwhile
        indexes = dict(await conn.fetch(JOBS_INDEXES))
        assert indexes["jobs_listing_by_id"] is False
        assert indexes["jobs_listing_at_rest"] and indexes["jobs_submit_seq"]
        assert await conn.fetch("SELECT name FROM evora.index_builds") == [("jobs_listing_by_id",)]
        listing = [[str(j["id"]), str(j["state"])] for j in (await store.list_jobs(limit=500)).jobs]
        assert listing == listed_before[:500]
        # `evora doctor` and `evora migrate --check` say what is left
        [found] = [
            c
            for c in await run_checks(Settings(database_url=empty_db_url))
            if c.name == "migrations"
        ]
        assert found.verdict == "warn", found
        assert "evora.jobs_listing_by_id" in found.detail and "jobs_submit_seq" in found.detail
        assert any(
            "jobs_listing_by_id is left to the next `evora migrate`" in line
            for line in await drift(conn)
        )
        await held.rollback()
        # the next `evora migrate` drops the leftover, builds the index and drops the two it
        # replaces, while submissions go on
        going, stop = asyncio.Event(), asyncio.Event()
        writer = asyncio.create_task(_keep_submitting(store, going, stop))
        await going.wait()
        assert await apply_migrations(empty_db_url) == []
        stop.set()
        assert await writer > 10
        indexes = dict(await conn.fetch(JOBS_INDEXES))
        assert indexes["jobs_listing_by_id"] is True
        assert "jobs_listing_at_rest" not in indexes and "jobs_submit_seq" not in indexes
        assert await conn.fetchval("SELECT count(*) FROM evora.index_builds") == 0
        assert await conn.fetchval("SELECT count(*) FROM evora.retiring_indexes") == 0
        assert await unfinished_index_builds(conn) == []
        # the upgraded schema is the one a new installation gets
        assert await drift(conn) == []
        # every job listed before, in the ids' order, below the ones submitted since
        listing = [[str(j["id"]), str(j["state"])] for j in await _every(store)]
        assert listing[-len(listed_before) :] == listed_before
        assert len(listing) == await conn.fetchval("SELECT count(*) FROM evora.jobs")
        # the cursor the release before gave (a submit_seq) goes on from the newest job
        # submitted before the one it names, in the ids' order (which, for that release's ids,
        # random within their millisecond, is not quite the submissions')
        resumed = await conn.fetchval(
            "SELECT id FROM evora.jobs WHERE submit_seq < $1 ORDER BY submit_seq DESC LIMIT 1",
            before["cursor"],
        )
        page = await store.list_jobs(queue="l", limit=5, after=before["cursor"])
        on = [j["id"] for j in await _every(store) if j["queue"] == "l" and j["id"] <= resumed]
        assert [j["id"] for j in page.jobs] == on[:5]
        # the filtered page reads the new index, the unfiltered one the primary key, and
        # neither reads the whole table
        for filters, args, index in (
            (("queue", "state"), ["m", "PENDING", 6], "jobs_listing_by_id"),
            ((), [6], "jobs_pkey"),
        ):
            statement = queries.list_jobs(filters, after=False)
            plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN {statement}", *args))
            assert index in plan and "Seq Scan" not in plan, plan
        report = await audit(conn)
        assert report.ok, report.text()
    finally:
        await store.close()
        await pool.close()
        await holder.close()
        await conn.close()


async def _every(store: JobStore) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = []
    after: uuid.UUID | None = None
    while True:
        page = await store.list_jobs(limit=500, after=after)
        jobs += page.jobs
        if page.next_after is None:
            return jobs
        after = page.next_after
