"""Retention of flow-control token buckets (docs/flow-control.md, "What is kept"): the sweeper
removes a bucket that carries nothing (full by now, or of a key no rate limits, and not
throttled by an upstream), since the claim makes a missing one full; a bucket a claim is
spending at that moment, in a transaction still open or one that commits while the pass
runs, keeps what the claim spent, so a key never gets a second full bucket within its
rate."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from datetime import datetime

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage.audit import audit
from evora.storage.db import create_pool
from evora.storage.jobs import Completion, JobStore
from evora.storage.limits import LimitSpec, LimitStore, Rate
from evora.storage.retention import RetentionStore
from tests.conftest import Clock
from tests.polling import until
from tests.sweeper.conftest import FAST, StartSweeper, done_or_waiting

Q = "buckets"
# Enough spent buckets for a pass to walk them over ten statements (PRUNE_BATCH keys each):
# what is checked is which rows go and which stay, not how long a pass takes. 50,000 cost
# 19 s of a loaded run; without a pruner 5,000 fail as 50,000 did (not pruned within 60 s).
TENANTS = 5_000
PRUNE_BATCH = 500
# a tenant's rate: 5 claims a minute
RATE = Rate(5, 60.0)


@pytest.fixture
def limits(pool: asyncpg.Pool) -> LimitStore:
    return LimitStore(pool)


async def _submit(store: JobStore, count: int, key: str) -> None:
    # leases outlive the clock's advances: the sweeper puts no job back
    await store.submit_batch(
        [
            JobSubmission(queue=Q, type="t", limit_keys=[key], lease_seconds=86_400)
            for _ in range(count)
        ]
    )


async def _claimed(store: JobStore, key: str, count: int) -> int:
    """Submits `count` jobs holding `key` and claims as many as it can: how many it got."""
    await _submit(store, count, key)
    jobs = await store.claim(worker_id="w", queues=[Q], max_jobs=count)
    assert {k for j in jobs for k in j["limit_keys"]} <= {key}
    return len(jobs)


async def _buckets(pool: asyncpg.Pool) -> set[str]:
    return {r["key"] for r in await pool.fetch("SELECT key FROM evora.flow_buckets")}


async def test_buckets_that_carry_nothing_are_pruned(
    start_sweeper: StartSweeper,
    store: JobStore,
    limits: LimitStore,
    pool: asyncpg.Pool,
    clock: Clock,
) -> None:
    await limits.put("tenant:*", LimitSpec(concurrency=None, rate=RATE))
    await limits.put("slot:*", LimitSpec(concurrency=2, rate=None))
    # what TENANTS tenants that each spent their minute's 5 claims leave behind
    await pool.execute(
        "INSERT INTO evora.flow_buckets (key, tokens, refilled_at)"
        " SELECT 'tenant:' || lpad(n::text, 6, '0'), 0, evora.clock_now()"
        " FROM generate_series(1, $1) AS n",
        TENANTS,
    )
    # and the rows real claims make: a tenant that spent one token, keys limited by
    # concurrency alone (one job of each still RUNNING), and a key whose limit went
    for n in range(10):
        assert await _claimed(store, f"tenant:claimed-{n}", 1) == 1
        assert await _claimed(store, f"slot:{n}", 1) == 1
    await limits.put("gone", LimitSpec(concurrency=1, rate=None))
    assert await _claimed(store, "gone", 1) == 1
    await pool.execute("DELETE FROM evora.flow_limits WHERE key = 'gone'")
    # an upstream throttles one tenant for a day (evora.drain_buckets())
    await pool.execute(
        "SELECT evora.drain_buckets(ARRAY['tenant:drained'],"
        " ARRAY[evora.clock_now() + interval '1 day'])"
    )
    await clock.advance(50)
    # 50 s on, tenants spending their five now
    recent = {f"tenant:recent-{n}" for n in range(10)}
    for key in recent:
        assert await _claimed(store, key, 5) == 5
    # 70 s on, every bucket spent before is full again, theirs are not
    await clock.advance(20)
    before = await pool.fetchval("SELECT count(*) FROM evora.flow_buckets")
    assert before == TENANTS + 10 + 10 + 1 + 1 + len(recent)

    sweeper = await start_sweeper(replace(FAST, prune_batch=PRUNE_BATCH))

    async def only_those_holding_something() -> bool:
        return await _buckets(pool) == recent | {"tenant:drained"}

    # ten batches a pass; 50,000 rows in batches of 5,000 took over 10 s under load
    await until(
        only_those_holding_something, "the buckets that carry nothing to be pruned", within=60
    )
    await until(
        lambda: (
            sweeper.metric("evora_sweeper_pruned_total", kind="flow_buckets")
            == before - len(recent) - 1
        ),
        "the pruned buckets to be counted",
    )
    # A pruned key is limited exactly as a key never claimed: its five, then nothing.
    assert await _claimed(store, "tenant:000001", 10) == 5
    assert await _claimed(store, "tenant:never-claimed", 10) == 5
    assert await _claimed(store, "tenant:claimed-0", 10) == 5
    # What was kept still holds: the recent ones refilled by a token or two only, the drained
    # one throttled.
    assert await _claimed(store, "tenant:recent-0", 5) < 5
    assert await _claimed(store, "tenant:drained", 3) == 0
    # A concurrency is counted from the RUNNING jobs, not the bucket: one more job each.
    assert await _claimed(store, "slot:0", 3) == 1


async def test_a_claim_spending_the_bucket_keeps_what_it_spent(
    store: JobStore, limits: LimitStore, pool: asyncpg.Pool, db_url: str, clock: Clock
) -> None:
    await limits.put("hot", LimitSpec(concurrency=None, rate=RATE))
    # a bucket claimed once long ago: full again, prunable
    assert await _claimed(store, "hot", 1) == 1
    await clock.advance(3600)
    await _submit(store, 10, "hot")
    holder = await asyncpg.connect(db_url)
    try:
        held = holder.transaction()
        await held.start()
        # A claim in a transaction still open took the bucket's five tokens...
        spent = await holder.fetchval(
            "SELECT count(*) FROM evora.claim_limited(ARRAY[$1], NULL, 10, 'held')", Q
        )
        assert spent == 5
        # ... when the sweeper looks at the bucket, whose committed version is full.
        pruning = asyncio.create_task(RetentionStore(pool).prune_flow_buckets("", 1000))

        # The pass either passes over the held bucket or waits for its claim: the claim
        # commits at that moment, the unlucky one.
        await until(
            lambda: done_or_waiting(pool, pruning), "the pass to finish or wait for the held bucket"
        )
        await held.commit()
        await pruning
    finally:
        await holder.close()
    assert await _buckets(pool) == {"hot"}
    # Within the minute, the key has nothing left: no second full bucket.
    assert await RetentionStore(pool).prune_flow_buckets("", 1000) == (0, None)
    assert await store.claim(worker_id="w", queues=[Q], max_jobs=10) == []


async def test_concurrent_claims_and_prunes_never_exceed_the_rate(
    store: JobStore, limits: LimitStore, pool: asyncpg.Pool, db_url: str
) -> None:
    """A natural race, autocommit statements only: claimers of one rate-limited key claim at
    random moments, the bucket often full again between two of them, while the pruner runs
    in a loop. A bucket pruned after a claim spent it would give the key a second full
    bucket at once."""
    limit, per = 2, 0.1
    await limits.put("hot", LimitSpec(concurrency=None, rate=Rate(limit, per)))
    await _submit(store, 400, "hot")
    stores = [JobStore(await create_pool(db_url, min_size=1, max_size=1)) for _ in range(4)]
    retention = RetentionStore(pool)
    claiming = True
    pruned = 0
    try:

        async def claim(s: JobStore, seed: int) -> None:
            rnd = random.Random(seed)
            ending = asyncio.get_running_loop().time() + 5
            while asyncio.get_running_loop().time() < ending:
                jobs = await s.claim(worker_id="w", queues=[Q], max_jobs=rnd.randint(1, limit))
                await s.complete_many([Completion(j["id"], j["lease_token"]) for j in jobs])
                await asyncio.sleep(rnd.uniform(0, 2 * per))

        async def prune() -> None:
            nonlocal pruned
            while claiming:
                pruned += (await retention.prune_flow_buckets("", 100))[0]

        pruner = asyncio.create_task(prune())
        try:
            await asyncio.gather(*(claim(s, n) for n, s in enumerate(stores)))
        finally:
            claiming = False
            await pruner
    finally:
        for s in stores:
            await s.close()
            await s.pool.close()
    assert pruned > 0
    started: list[datetime] = [
        r["started_at"]
        for r in await pool.fetch(
            "SELECT started_at FROM evora.jobs WHERE started_at IS NOT NULL ORDER BY started_at"
        )
    ]
    assert len(started) > limit
    # a bucket of `limit` refilled at limit / per a second: in any span, at most `limit`
    # and what refilled during it
    for i, first in enumerate(started):
        for j in range(i + limit, len(started)):
            span = (started[j] - first).total_seconds()
            assert j - i + 1 <= limit + span * limit / per + 1e-6, (i, j, span)


@pytest.mark.parametrize("between", ["deleted", "rate-less"])
async def test_a_rate_put_back_after_a_spell_without_is_audited_from_a_full_bucket(
    store: JobStore, limits: LimitStore, pool: asyncpg.Pool, db_url: str, between: str
) -> None:
    """While no rate governs a key, its bucket goes, spent or not: with its limit when that
    is deleted (sql/limits.sql, delete_limit), or, when the limit is changed to a
    concurrency alone, in the sweeper's pass (no claim reads it). The rate put back starts
    from a full bucket, as a new key's (docs/flow-control.md), and the auditor must judge
    the claims after it so too, not against the tokens spent before, even when the limit
    put back equals the one before. (The auditor judges a claim against a limit only from
    5 s after the limit's last change: hence the waits.)"""
    await limits.put("hot", LimitSpec(concurrency=None, rate=RATE))
    await asyncio.sleep(6)
    assert await _claimed(store, "hot", 5) == 5
    await asyncio.sleep(1.5)
    if between == "deleted":
        await limits.delete("hot")
    else:
        await limits.put("hot", LimitSpec(concurrency=10, rate=None))
    await RetentionStore(pool).prune_flow_buckets("", 1000)
    assert await _buckets(pool) == set()
    await limits.put("hot", LimitSpec(concurrency=None, rate=RATE))
    await asyncio.sleep(6)
    # within the minute of the first five, five more: a full bucket, as a new key's
    assert await _claimed(store, "hot", 10) == 5
    report = await audit(db_url)
    assert report.ok, report.text()
