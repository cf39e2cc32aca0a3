"""Changing a limit while claims run (docs/flow-control.md, "When a limit applies"): a limit
applies to every claim begun after its PUT returned, even the very first limit racing with
claims that began before it and saw none; RUNNING jobs above a lowered limit finish
normally while nothing more is admitted."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage import limits as limits_module
from evora.storage import queries
from evora.storage.jobs import JobStore
from evora.storage.limits import LimitSpec, LimitStore
from tests.polling import until

Q = "changes"
KEY = "api:x"


@pytest.fixture
def limits(pool: asyncpg.Pool) -> LimitStore:
    return LimitStore(pool)


async def _submit(store: JobStore, count: int) -> None:
    await store.submit_batch(
        [JobSubmission(queue=Q, type="t", limit_keys=[KEY]) for _ in range(count)]
    )


async def _claim(store: JobStore, max_jobs: int = 100) -> list[dict[str, Any]]:
    return await store.claim(worker_id="w", queues=[Q], max_jobs=max_jobs)


async def _running(pool: asyncpg.Pool) -> int:
    count: int = await pool.fetchval("SELECT count(*) FROM evora.jobs WHERE state = 'RUNNING'")
    return count


async def test_a_claim_begun_before_the_first_limit_is_counted_by_every_claim_after_it(
    db_url: str, pool: asyncpg.Pool, store: JobStore, limits: LimitStore
) -> None:
    await _submit(store, 10)
    # A claim that began before any limit existed and is still open (a slow one): it took
    # three jobs of the key without a limit to count them against.
    early = await asyncpg.connect(db_url)
    try:
        open_claim = early.transaction()
        await open_claim.start()
        began_before = await early.fetch(queries.CLAIM, [Q], None, 3, "early")
        assert len(began_before) == 3

        put = asyncio.create_task(limits.put(KEY, LimitSpec(concurrency=3, rate=None)))

        async def claim_after_the_put() -> list[dict[str, Any]]:
            await put
            return await _claim(store)

        late = asyncio.create_task(claim_after_the_put())
        await asyncio.sleep(0.5)  # the early claim stays open a while
        await open_claim.commit()
        admitted_after = await asyncio.wait_for(late, 10)
    finally:
        await early.close()
    # the claim begun after the PUT returned saw the three jobs RUNNING: nothing was left
    assert admitted_after == []
    assert await _running(pool) == 3


async def test_no_claim_begun_after_the_put_exceeds_it_with_concurrent_claimers(
    pool: asyncpg.Pool, store: JobStore, limits: LimitStore
) -> None:
    concurrency = 20
    await _submit(store, 300)
    put_returned: float | None = None
    # per claim: whether it began after the PUT returned, and how many jobs it took
    claims: list[tuple[bool, int]] = []
    stop = asyncio.Event()

    async def claimer() -> None:
        while not stop.is_set():
            began_after = put_returned is not None
            got = await _claim(store, max_jobs=1)
            claims.append((began_after, len(got)))

    claimers = [asyncio.create_task(claimer()) for _ in range(6)]
    try:
        # no limit yet: claims run freely
        await until(lambda: sum(n for _, n in claims) >= 5, "the first claims")
        await limits.put(KEY, LimitSpec(concurrency=concurrency, rate=None))
        put_returned = time.monotonic()
        await until(
            lambda: sum(1 for after, _ in claims if after) >= 50, "claims after the PUT", within=30
        )
    finally:
        stop.set()
        await asyncio.gather(*claimers)
    before = sum(n for after, n in claims if not after)
    after = sum(n for after, n in claims if after)
    assert any(after for after, _ in claims)
    # what began before may have gone over (it saw no limit); nothing begun after did
    assert after == max(0, concurrency - before)
    assert await _running(pool) == max(concurrency, before)


async def test_running_jobs_above_a_lowered_limit_finish_and_nothing_is_admitted_until_below(
    store: JobStore, limits: LimitStore
) -> None:
    await limits.put(KEY, LimitSpec(concurrency=5, rate=None))
    await _submit(store, 10)
    running = await _claim(store)
    assert len(running) == 5
    await limits.put(KEY, LimitSpec(concurrency=2, rate=None))
    assert await _claim(store) == []
    for job in running[:3]:  # 2 left RUNNING: at the limit, still no room
        await store.complete(job["id"], job["lease_token"])
    assert await _claim(store) == []
    await store.complete(running[3]["id"], running[3]["lease_token"])
    assert len(await _claim(store)) == 1
    assert (await limits.usage(KEY))["running"] == 2


async def test_a_put_does_not_wait_for_a_transaction_open_longer_than_a_claim_lasts(
    db_url: str,
    limits: LimitStore,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A report (or a session left idle in a transaction) open since before the window a
    # claim could have begun in: a PUT does not wait for it to end, and says nothing.
    monkeypatch.setattr(limits_module, "SETTLE_SECONDS", 0.5)
    report = await asyncpg.connect(db_url)
    try:
        async with report.transaction():
            await report.fetchval("SELECT 1")
            await asyncio.sleep(1.0)  # twice the window
            with caplog.at_level(logging.WARNING, logger=limits_module.__name__):
                await limits.put(KEY, LimitSpec(concurrency=3, rate=None))
    finally:
        await report.close()
    assert [r.getMessage() for r in caplog.records if r.name == limits_module.__name__] == []
