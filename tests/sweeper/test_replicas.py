"""Several sweepers on one database: one active (the advisory lock), the others standing by
and taking over when the active one's lock connection dies; and when passes do run at once,
every due lease and TTL is still handled exactly once."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime

import asyncpg

from evora.config import Settings
from evora.http.metrics import ServiceMetrics
from evora.protocol.jobs import Backoff, JobSubmission
from evora.storage import locks
from evora.storage.db import create_pool
from evora.storage.jobs import JobStore
from evora.storage.retention import RetentionStore
from evora_services.sweeper.metrics import SweeperMetrics
from evora_services.sweeper.sweeper import Retention, Sweeper, Tuning
from tests.polling import until
from tests.sweeper.conftest import (
    RunningSweeper,
    StartSweeper,
    claimed,
    counted,
    event_names,
    force_lease_expiry,
)

# pg_locks shows a bigint advisory key as two 32-bit halves.
_LOCK_HOLDER = """
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND granted AND database = (
    SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid::int8 = $1::int8 >> 32 AND objid::int8 = $1::int8 & 4294967295
"""


async def lock_holders(pool: asyncpg.Pool) -> list[int]:
    return [r["pid"] for r in await pool.fetch(_LOCK_HOLDER, locks.SWEEPER)]


async def test_one_sweeper_active_and_a_standby_takes_over(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool
) -> None:
    replicas = [await start_sweeper(), await start_sweeper()]

    def active() -> list[RunningSweeper]:
        return [r for r in replicas if r.active]

    await until(lambda: len(active()) == 1, "one active sweeper")
    [first] = active()
    [holder] = await lock_holders(pool)
    assert (
        await pool.fetchval("SELECT application_name FROM pg_stat_activity WHERE pid = $1", holder)
        == "evora-sweeper-lock"
    )

    # Only the active one sweeps.
    job = await claimed(store, "one", max_attempts=5)
    await force_lease_expiry(pool, job["id"])

    async def expired_once() -> bool:
        return (await event_names(pool, job["id"]))[-1] == "lease_expired"

    await until(expired_once, "the lease to be expired")
    assert await event_names(pool, job["id"]) == ["submitted", "claimed", "lease_expired"]
    await counted(first, "evora_sweeper_leases_expired_total", outcome="requeued")
    assert [
        r.metric("evora_sweeper_leases_expired_total", outcome="requeued") for r in replicas
    ] == [1 if r is first else 0 for r in replicas]

    # Kill the active replica's lock connection: it stops, the standby takes over.
    assert await pool.fetchval("SELECT pg_terminate_backend($1)", holder)
    [second] = [r for r in replicas if r is not first]
    await until(lambda: second.active and not first.active, "the standby to take over")

    async def new_holder() -> bool:
        holders = await lock_holders(pool)
        return len(holders) == 1 and holders != [holder]

    await until(new_holder, "the lock to be held by the new active replica")

    # The old one reconnected and stands by; the new one sweeps.
    job = await claimed(store, "two", max_attempts=5)
    await force_lease_expiry(pool, job["id"])

    async def expired_by_second() -> bool:
        return second.metric("evora_sweeper_leases_expired_total", outcome="requeued") == 1

    await until(expired_by_second, "the new active replica to expire the lease")
    assert await event_names(pool, job["id"]) == ["submitted", "claimed", "lease_expired"]
    assert first.metric("evora_sweeper_leases_expired_total", outcome="requeued") == 1
    assert not first.active

    async def both_connected() -> bool:
        connected: int = await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = 'evora-sweeper-lock' AND datname = current_database()"
        )
        return connected == 2

    await until(both_connected, "the old active replica to reconnect as a standby")
    assert len(await lock_holders(pool)) == 1 and not first.active


def _sweeper(pool: asyncpg.Pool, batch: int) -> Sweeper:
    settings = Settings(database_url="postgresql://unused", tokens="admin:test-admin-token")
    return Sweeper(
        JobStore(pool),
        RetentionStore(pool),
        SweeperMetrics(ServiceMetrics("sweeper")),
        Retention.from_settings(settings),
        Tuning(expiry_batch=batch),
    )


LONG_AGO = datetime(2001, 1, 1, tzinfo=UTC)
LEASES = 300
TTLS = 150
ROUNDS = 3


async def test_concurrent_passes_handle_each_deadline_exactly_once(
    db_url: str, store: JobStore, pool: asyncpg.Pool
) -> None:
    """Both replicas sweeping at once (as if both thought they held the lock): small batches
    so their statements interleave over the same rows."""
    pools = [await create_pool(db_url, min_size=2, max_size=2) for _ in range(2)]
    try:
        sweepers = [_sweeper(p, batch=7) for p in pools]
        fast_retry = Backoff(initial_seconds=0.001, max_seconds=0.001)
        submitted = await store.submit_batch(
            [
                JobSubmission(queue="lease", type="t", max_attempts=100, backoff=fast_retry)
                for _ in range(LEASES)
            ]
        )
        lease_ids = {s.job["id"] for s in submitted}
        for round_ in range(1, ROUNDS + 1):
            # Every job claimed again (its retry is due at once) and its lease run out.
            claims = await store.claim(worker_id="w", queues=["lease"], max_jobs=LEASES)
            assert {j["id"] for j in claims} == lease_ids
            await force_lease_expiry(pool, *lease_ids)
            if round_ == ROUNDS:
                await store.submit_batch(
                    [JobSubmission(queue="ttl", type="t", expires_at=LONG_AGO) for _ in range(TTLS)]
                )
            async with asyncio.timeout(30):
                passes = await asyncio.gather(*(s.expire_due() for s in sweepers + sweepers))
            assert sum(p.leases["requeued"] for p in passes) == LEASES, round_
            per_job = await pool.fetch(
                "SELECT job_id, count(*) AS n FROM evora.job_events "
                "WHERE event = 'lease_expired' GROUP BY job_id"
            )
            assert {r["job_id"] for r in per_job} == lease_ids
            assert Counter(r["n"] for r in per_job) == Counter({round_: LEASES}), round_
        assert sum(p.ttls for p in passes) == TTLS
        dead = await pool.fetch(
            "SELECT job_id, count(*) AS n FROM evora.job_events "
            "WHERE event = 'dead_lettered' GROUP BY job_id"
        )
        assert len(dead) == TTLS and {r["n"] for r in dead} == {1}
        assert await pool.fetchval("SELECT count(*) FROM evora.jobs WHERE state = 'DLQ'") == TTLS
    finally:
        for p in pools:
            await p.close()
