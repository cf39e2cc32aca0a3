"""PostgreSQL itself killed with SIGKILL, every process of the cluster at once (as a host
crash or the OOM killer does), and restarted, twice, while producers submit and a worker
runs jobs through all four services, each a real `evora` process with production defaults.

What must hold: no job whose submission was answered is lost or made twice (producers
repeat unanswered submissions with their idempotency key, as the SDK documents); every one
completes; the services ride the outage out on their own (nothing restarts them) and the
only errors clients see meanwhile are 503s and broken connections, never a 500; and the read
models converge to the tables afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from bench.procstats import children_of, postmaster_pid
from evora import Client, Handlers, Job, Worker
from evora.embedded import LocalPostgres
from evora.protocol.jobs import JobSubmission
from evora.sdk.errors import EvoraClientError, EvoraHTTPError
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.outbox import OutboxCursor, Span, read_batch
from tests.e2e.clusters import cluster_dir, migrated_primary
from tests.e2e.conftest import FAST, Child, Children
from tests.fuzz.conftest import spawn
from tests.polling import until
from tests.servers import ADMIN_TOKEN, PRODUCER_TOKEN, WORKER_TOKEN

QUEUE = "crash"
PRODUCERS = 2
JOBS_EACH = 150
CRASH_AFTER = (60, 180)  # accepted submissions before each crash
OUTAGE_SECONDS = 1.0


async def _kill_cluster(pg: LocalPostgres) -> None:
    """SIGKILL the postmaster and every process it started, at once, as a host crash would:
    frozen first, so that no backend sees the postmaster go and ends on its own terms (each
    backend leads its own process group, so one killpg would not reach them)."""
    postmaster = postmaster_pid(pg.data_dir)
    assert postmaster is not None
    os.kill(postmaster, signal.SIGSTOP)
    for child in children_of(postmaster):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    os.kill(postmaster, signal.SIGKILL)
    await until(lambda: not pg.running, "the killed postmaster is gone", within=30)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """The killed server's data directory, in memory (tests/e2e/clusters.py): a kill -9 keeps
    all PostgreSQL wrote to its files, on a disk or not; what it had not written (a commit
    left in its WAL buffers, a page only in shared buffers) it loses either way."""
    with cluster_dir("evora-test-crash-") as tmp:
        yield tmp / "pg"


def _reached(accepted: dict[str, str], count: int) -> bool:
    return len(accepted) >= count


async def _spawn_all(
    children: Children, dsn: str, mongo_url: str, mongo_db: str
) -> dict[str, tuple[Child, str]]:
    return {
        service: await spawn(
            children, service, dsn, EVORA_MONGO_URL=mongo_url, EVORA_MONGO_DB=mongo_db
        )
        for service in ("api", "dispatcher", "sweeper", "projector")
    }


async def test_postgres_killed_twice_under_load_loses_nothing(
    data_dir: Path, tmp_path: Path, mongo_url: str, mongo_db_name: str, children: Children
) -> None:
    pg = await migrated_primary(data_dir, durable=True, log_path=tmp_path / "pg.log")
    await asyncio.to_thread(pg.start)
    try:
        async with aiohttp.ClientSession() as http:
            services = await _spawn_all(children, pg.dsn(), mongo_url, mongo_db_name)
            api_url, dispatcher_url = services["api"][1], services["dispatcher"][1]

            runs: Counter[str] = Counter()
            handlers = Handlers()

            @handlers.job("work")
            async def work(job: Job) -> None:
                runs[job.id] += 1

            worker = Worker(
                dispatcher_url,
                WORKER_TOKEN,
                [QUEUE],
                handlers=handlers,
                concurrency=8,
                wait_seconds=2.0,
                backoff=FAST,
                request_timeout=5.0,
            )
            serving = asyncio.create_task(worker.serve())

            accepted: dict[str, str] = {}  # idempotency key -> job id
            refusals: Counter[int] = Counter()  # statuses of refused submissions

            async def produce(producer: int, client: Client) -> None:
                for i in range(JOBS_EACH):
                    key = f"p{producer}-{i}"
                    while True:  # a submission is repeated, with its key, until answered
                        try:
                            result = await client.submit(
                                QUEUE, "work", {"i": i}, idempotency_key=key, lease_seconds=3
                            )
                        except EvoraHTTPError as exc:
                            refusals[exc.status] += 1
                            await asyncio.sleep(0.05)
                            continue
                        except EvoraClientError:
                            await asyncio.sleep(0.05)
                            continue
                        accepted[key] = result.id
                        break

            async def crash_twice() -> None:
                for threshold in CRASH_AFTER:
                    await until(functools.partial(_reached, accepted, threshold), within=60)
                    await _kill_cluster(pg)
                    # The outage lasts a second (its length, not a wait for anything), so
                    # every service meets a database that refuses connections.
                    await asyncio.sleep(OUTAGE_SECONDS)
                    await asyncio.to_thread(pg.start)  # crash recovery, on the same port

            async with Client(api_url, PRODUCER_TOKEN, retries=0) as client:
                await asyncio.gather(crash_twice(), *(produce(n, client) for n in range(PRODUCERS)))

            conn = await asyncpg.connect(pg.dsn())
            try:

                async def all_completed() -> bool:
                    done = await conn.fetchval(
                        "SELECT count(*) FROM evora.jobs WHERE queue = $1 AND state = 'COMPLETED'",
                        QUEUE,
                    )
                    return bool(done == PRODUCERS * JOBS_EACH)

                await until(all_completed, "every accepted job completed", within=120)
                rows = await conn.fetch(
                    "SELECT idempotency_key, id::text FROM evora.jobs WHERE queue = $1", QUEUE
                )
                last_seq = await conn.fetchval("SELECT max(seq) FROM evora.job_events")
            finally:
                await conn.close()
            await worker.stop()
            await serving

            # Each answered submission is one job, the one it was answered with; none more.
            assert {r["idempotency_key"]: r["id"] for r in rows} == accepted
            assert set(runs) == set(accepted.values())
            # Clients saw the outages as 503s (and broken connections), never as a 500.
            assert set(refusals) == {503}, refusals
            recoveries = (tmp_path / "pg.log").read_text().count("automatic recovery in progress")
            assert recoveries == len(CRASH_AFTER)
            # Nobody restarted the services: they reconnected by themselves.
            for name, (child, url) in services.items():
                assert child.running, f"{name} exited:\n{child.output()}"
                await child.until_ready(http, url)

            async with Client(api_url, ADMIN_TOKEN) as admin:

                async def converged() -> bool:
                    stats = await admin.stats(QUEUE)
                    return bool(
                        stats["as_of"]["seq"] == last_seq
                        and stats["counts"]["COMPLETED"] == PRODUCERS * JOBS_EACH
                        and stats["totals"]["submitted"] == PRODUCERS * JOBS_EACH
                    )

                await until(converged, "the read models caught up", within=60)
    finally:
        await asyncio.to_thread(pg.stop)


async def test_a_span_target_stays_right_through_a_crash_that_loses_a_notify_only_commit(
    data_dir: Path, tmp_path: Path
) -> None:
    """A span target is stored outside PostgreSQL (the projector's checkpoint in MongoDB), so
    it outlives a crash. A transaction that sent only a NOTIFY took an xid, yet its commit
    does not wait for the disk; the target taken next counts it finished. Here the WAL
    writer is frozen, so that commit is still only in PostgreSQL's memory when the cluster
    is killed: recovery then hands its xid to the next transaction, a submission. On the code
    before migration 0060 that submission's events were below the stored target's xmax and
    not among its running transactions, so no span ever held them (its `submitted` event
    was never read: failed 3 of 3). The reader now writes each new target durably before
    returning it, which puts the NOTIFY's commit on disk first."""
    pg = await migrated_primary(data_dir, durable=True, log_path=tmp_path / "pg.log")
    await asyncio.to_thread(pg.start)
    try:
        conn = await asyncpg.connect(pg.dsn())
        try:
            # nothing but this test takes an xid after the restart (an ANALYZE would)
            await conn.execute("ALTER SYSTEM SET autovacuum = off")
            await conn.execute("SELECT pg_reload_conf()")
        finally:
            await conn.close()
        pool = await create_pool(pg.dsn(), min_size=1, max_size=2)
        store = JobStore(pool)
        try:
            await store.submit(JobSubmission(queue=QUEUE, type="before"))
            first = await read_batch(pool, Span(), OutboxCursor(), 100, bucket_seconds=60)
            assert first is not None and first.events == 1
            stored = Span(first.target)  # the span after it, as the projector would store it
            await store.submit(JobSubmission(queue=QUEUE, type="in_the_span"))
            walwriter = await pool.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
            )
            os.kill(walwriter, signal.SIGSTOP)  # nothing flushes an asynchronous commit now
            notify_xid = await pool.fetchval(
                "SELECT pg_current_xact_id()::text::int8 FROM pg_notify('evora_test_only', '')"
            )
            batch = await read_batch(pool, stored, OutboxCursor(1), 100, bucket_seconds=60)
            assert batch is not None and batch.events == 1
            stored = Span(batch.target)  # the span done: its target is the next one's start
        finally:
            await store.close()
            await pool.close()
        await _kill_cluster(pg)
        await asyncio.to_thread(pg.start)

        pool = await create_pool(pg.dsn(), min_size=1, max_size=2)
        store = JobStore(pool)
        try:
            after = await store.submit(JobSubmission(queue=QUEUE, type="after_the_crash"))
            taken = await pool.fetchval(
                "SELECT xid::text::int8 FROM evora.job_events WHERE job_id = $1", after.id
            )
            read = await read_batch(pool, stored, OutboxCursor(2), 100, bucket_seconds=60)
            # The submission after the crash is in the span after the stored target, because
            # the NOTIFY's commit survived and its xid was not handed out again.
            assert read is not None and read.events == 1, (notify_xid, taken)
            assert taken > notify_xid
        finally:
            await store.close()
            await pool.close()
    finally:
        await asyncio.to_thread(pg.stop)
