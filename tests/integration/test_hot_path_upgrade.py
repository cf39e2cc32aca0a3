"""The upgrade to a narrow hot path (migration 0038 and evora.event_image()): a database at
0036 with that release's function files and history in it migrates; the listing answers every
page as it did, through the new indexes; the events written before (whole images) and after
(narrow ones) make one history the auditor and the projector read whole."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from pymongo.asynchronous.database import AsyncDatabase

from evora.protocol.states import JobState
from evora.readmodels.layout import Document
from evora.storage.audit import audit
from evora.storage.db import create_pool
from evora.storage.jobs import Failure, JobStore
from evora.storage.migrate import apply_migrations, current_version
from evora.storage.statements import with_rules
from evora_services.projector.projector import Projector
from tests.projector.conftest import catch_up
from tests.projector.test_projection import assert_matches_truth
from tests.projector.workload import mixed_workload

BEFORE = 36
REPO = Path(__file__).resolve().parents[2]
# main with migration 0036 its newest: its function files are what a database at 0036 runs.
BEFORE_NARROW = "67427cb"
QUEUES = ["alpha", "beta"]
FILES = "shared/evora/storage/functions"
JOBS_INDEXES = (
    "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
    " WHERE i.indrelid = 'evora.jobs'::regclass AND i.indisvalid"
)


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture
async def old_url(pg_server_url: str) -> AsyncIterator[str]:
    """A database of its own at migration 0036, with the function files of that release
    (their rules expanded as `evora migrate` does)."""
    name = f"m0038_{uuid.uuid4().hex}"
    admin = await asyncpg.connect(pg_server_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
        url = urlunsplit(urlsplit(pg_server_url)._replace(path=f"/{name}"))
        await apply_migrations(url, upto=BEFORE)
        conn = await asyncpg.connect(url)
        try:
            names = _git("ls-tree", "--name-only", f"{BEFORE_NARROW}:{FILES}").split()
            for n in sorted(names):
                if n.endswith(".sql"):
                    await conn.execute(with_rules(_git("show", f"{BEFORE_NARROW}:{FILES}/{n}")))
        finally:
            await conn.close()
        yield url
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def _old_fail_many(pool: asyncpg.Pool) -> Callable[[Sequence[Failure]], Awaitable[None]]:
    """Failures through the SQL `evora.fail` of BEFORE_NARROW: today's `fail` statement calls
    a function form later migrations add (0044)."""

    async def fail_many(failures: Sequence[Failure]) -> None:
        for f in failures:
            await pool.execute(
                "SELECT evora.fail($1, $2, $3::jsonb, $4, $5)",
                f.id,
                f.lease_token,
                f.error(),
                f.retryable,
                f.retry_in_seconds,
            )

    return fail_many


async def _pages(store: JobStore) -> list[list[Any]]:
    """Every listing the api builds, each page by page."""
    listed = []
    for filters in ({}, {"queue": "alpha"}, {"state": JobState.RUNNING}, {"type": "b"}):
        for state in (None, JobState.PENDING, JobState.RUNNING, JobState.COMPLETED):
            chosen: dict[str, Any] = {**filters, **({"state": state} if state else {})}
            seen, after = [], None
            while True:
                page = await store.list_jobs(**chosen, limit=7, after=after)
                seen += [(j["id"], j["state"]) for j in page.jobs]
                if page.next_after is None:
                    break
                after = page.next_after
            listed.append(seen)
    return listed


async def test_jobs_and_history_survive_the_upgrade_and_read_alike(
    old_url: str, mongo: AsyncDatabase[Document]
) -> None:
    pool = await create_pool(old_url, min_size=1, max_size=4)
    try:
        store = JobStore(pool)
        async with pool.acquire() as conn:
            assert await current_version(conn) == BEFORE
        await mixed_workload(
            store, pool, jobs=120, queues=QUEUES, seed=3, rounds=6, fail_many=_old_fail_many(pool)
        )
        # some jobs still RUNNING across the upgrade
        running = await store.claim(worker_id="across", queues=QUEUES, max_jobs=5)
        assert running
        projector = Projector(pool, mongo, 1, batch_size=50)
        await projector.run_once()  # part of the way, checkpoint recorded
        before = await _pages(store)
        assert {r["relname"] for r in await pool.fetch(JOBS_INDEXES)} >= {
            "jobs_listing",
            "jobs_submit_seq",
        }
    finally:
        await store.close()
        await pool.close()

    assert 38 in await apply_migrations(old_url)

    pool = await create_pool(old_url, min_size=1, max_size=4)
    try:
        store = JobStore(pool)
        indexes = {r["relname"] for r in await pool.fetch(JOBS_INDEXES)}
        assert "jobs_listing" not in indexes
        assert indexes >= {"jobs_listing_at_rest", "jobs_submit_seq"}
        assert await _pages(store) == before
        # the jobs RUNNING across it end under the narrow events, new ones run through
        for job in running:
            await store.complete(job["id"], job["lease_token"])
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
