"""The auditor as the net for the defects of issue 30: a history that breaks a promise,
made the way the defect makes it, is reported by the check it breaks. These assert that the
audit's verdict agrees with what the run did (counted independently from the answers), so
they hold before and after the defect's fix; before it, the teardown audit reports the
violation too (the defect is real), and they are deliberately not opted out of it."""

from __future__ import annotations

import asyncio
import time

import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.audit import audit
from evora.storage.jobs import JobStore


async def test_claims_beyond_a_rate_bucket_are_a_rate_limits_violation(
    store: JobStore, pool: asyncpg.Pool, db_url: str
) -> None:
    """Issue 30, defect 3: a limited claim that began before another but takes the bucket
    after it commits writes its own (earlier) start as the refill time, moving the bucket
    back and crediting the interval twice. A held transaction makes the late claim."""
    await pool.execute(
        "INSERT INTO evora.flow_limits (key, rate_limit, rate_per_seconds) VALUES ('queue:q',"
        " 10, 1)"
    )
    # the limit set well before the claims, so the audit holds them all to it
    await pool.execute("UPDATE evora.flow_limit_changes SET changed_at = now() - interval '1 hour'")
    await store.submit_batch([JobSubmission(queue="q", type="t") for _ in range(40)])
    late = await asyncpg.connect(db_url)
    try:
        async with late.transaction():
            await late.fetchval("SELECT now()")  # the transaction's clock starts here
            await asyncio.sleep(1.0)
            started = time.monotonic()
            first = await store.claim(worker_id="first", queues=["q"], max_jobs=5)
            held = await late.fetch(queries.CLAIM, ["q"], None, 5, "late")
    finally:
        await late.close()
    after = await store.claim(worker_id="after", queues=["q"], max_jobs=10)
    elapsed = time.monotonic() - started

    claimed = len(first) + len(held) + len(after)
    # a bucket of 10 at 10/s allows 10 at once plus what it refilled meanwhile (and the
    # audit's own slack of one token plus 0.25 s of refill)
    over = claimed > 10 + 10 * elapsed + 1 + 2.5
    report = await audit(db_url)
    assert (not report.check("rate_limits").ok) == over, (claimed, elapsed, report.text())
