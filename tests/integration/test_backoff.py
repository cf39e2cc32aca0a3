"""Retry delays follow the job's backoff policy: growing by the multiplier, jittered, capped."""

from __future__ import annotations

import asyncpg
import pytest

from evora.protocol.jobs import Backoff, JobSubmission
from evora.storage.jobs import Failure, JobStore
from tests.conftest import Clock


@pytest.mark.parametrize(
    ("initial", "maximum", "multiplier"), [(1.0, 3600.0, 2.0), (0.5, 30.0, 3.0), (5.0, 5.0, 1.0)]
)
async def test_delays_grow_and_stay_within_cap(
    pool: asyncpg.Pool, initial: float, maximum: float, multiplier: float
) -> None:
    for n in range(1, 40):
        expected = min(maximum, initial * multiplier ** (n - 1))
        samples = await pool.fetch(
            "SELECT evora.backoff_seconds($1, $2, $3, $4) AS d FROM generate_series(1, 50)",
            initial,
            maximum,
            multiplier,
            n,
        )
        for row in samples:
            assert 0.8 * expected - 1e-9 <= row["d"] <= min(maximum, 1.2 * expected) + 1e-9


async def test_huge_attempt_numbers_do_not_overflow(pool: asyncpg.Pool) -> None:
    delay = await pool.fetchval("SELECT evora.backoff_seconds(1, 86400, 1000, 1000)")
    assert delay == 86400


async def test_store_applies_the_jobs_own_policy(store: JobStore, clock: Clock) -> None:
    policy = Backoff(initial_seconds=2.0, max_seconds=20.0, multiplier=3.0)
    submitted = await store.submit(
        JobSubmission(queue="b", type="t", max_attempts=10, backoff=policy)
    )
    job_id = submitted.job["id"]
    waits: list[float] = []
    for attempt in range(1, 5):
        await clock.advance(max(waits, default=0.0) + 1)  # past the last backoff
        [job] = await store.claim(worker_id="w", queues=["b"])
        assert job["attempt"] == attempt
        failed = await store.fail(Failure(job_id, job["lease_token"], "again"))
        waits.append((failed["run_at"] - failed["updated_at"]).total_seconds())
    for attempt, wait in enumerate(waits, start=1):
        expected = min(20.0, 2.0 * 3.0 ** (attempt - 1))
        assert 0.8 * expected - 0.01 <= wait <= min(20.0, 1.2 * expected) + 0.01
    assert waits[3] <= 20.0
