"""Concurrency and rate limits enforced by the claim (docs/flow-control.md), on a real
PostgreSQL: per key, per prefix, per queue; freed by every way out of RUNNING; no
head-of-line blocking; round-robin lanes; exact under concurrent claimers."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.jobs import Failure, JobStore
from evora.storage.limits import LimitSpec, LimitStore, Rate
from tests.conftest import Clock
from tests.polling import until

Q = "flow"


@pytest.fixture
def limits(pool: asyncpg.Pool) -> LimitStore:
    return LimitStore(pool)


async def _submit(store: JobStore, count: int, *keys: str, queue: str = Q, **fields: Any) -> None:
    await store.submit_batch(
        [
            JobSubmission(queue=queue, type="t", limit_keys=list(keys), **fields)
            for _ in range(count)
        ]
    )


async def _claim(store: JobStore, max_jobs: int = 100, queue: str = Q) -> list[dict[str, Any]]:
    return await store.claim(worker_id="w", queues=[queue], max_jobs=max_jobs)


def _lanes(jobs: list[dict[str, Any]]) -> Counter[str]:
    return Counter(j["limit_keys"][0] if j["limit_keys"] else "" for j in jobs)


async def test_a_key_never_runs_more_than_its_concurrency(
    store: JobStore, limits: LimitStore
) -> None:
    await limits.put("tenant:a", LimitSpec(concurrency=3, rate=None))
    await _submit(store, 20, "tenant:a")
    first = await _claim(store)
    assert len(first) == 3 and first[0]["limit_keys"] == ["tenant:a"]
    assert await _claim(store) == []
    await store.complete(first[0]["id"], first[0]["lease_token"])
    assert len(await _claim(store)) == 1
    assert (await limits.usage("tenant:a"))["running"] == 3


async def test_a_saturated_key_does_not_block_the_jobs_behind_it(
    store: JobStore, limits: LimitStore
) -> None:
    await limits.put("busy", LimitSpec(concurrency=2, rate=None))
    await _submit(store, 300, "busy")
    await _submit(store, 5, "calm")
    await _submit(store, 5)
    claimed = await _claim(store, max_jobs=50)
    assert _lanes(claimed) == {"busy": 2, "calm": 5, "": 5}


async def test_prefix_limits_count_each_key_separately(store: JobStore, limits: LimitStore) -> None:
    await limits.put("tenant:*", LimitSpec(concurrency=1, rate=None))
    await limits.put("tenant:vip", LimitSpec(concurrency=3, rate=None))
    for key in ("tenant:1", "tenant:2", "tenant:vip"):
        await _submit(store, 4, key)
    claimed = await _claim(store)
    assert _lanes(claimed) == {"tenant:1": 1, "tenant:2": 1, "tenant:vip": 3}
    usage = await limits.usage("tenant:2")
    assert (usage["governed_by"], usage["running"], usage["throttled_jobs"]) == ("tenant:*", 1, 3)
    whole = await limits.usage("tenant:*")
    # the keys it governs: tenant:vip has a limit of its own, its jobs are not tenant:*'s
    assert (whole["running"], whole["throttled_jobs"]) == (2, 6)


async def test_a_queue_limit_applies_to_every_job_of_the_queue(
    store: JobStore, limits: LimitStore
) -> None:
    await limits.put(f"queue:{Q}", LimitSpec(concurrency=2, rate=None))
    await _submit(store, 3)
    await _submit(store, 3, "x")
    await _submit(store, 3, queue="other")
    assert len(await _claim(store)) == 2
    assert len(await _claim(store, queue="other")) == 3
    assert (await limits.usage(f"queue:{Q}"))["throttled_jobs"] == 4


async def test_every_way_out_of_running_frees_the_slot(
    store: JobStore, limits: LimitStore, clock: Clock
) -> None:
    await limits.put("k", LimitSpec(concurrency=1, rate=None))
    await _submit(store, 6, "k", lease_seconds=5)

    async def one() -> dict[str, Any]:
        [job] = await _claim(store)
        assert await _claim(store) == []
        return job

    job = await one()
    await store.complete(job["id"], job["lease_token"])
    job = await one()
    await store.fail(Failure(job["id"], job["lease_token"], "boom", retry_in_seconds=3600))
    job = await one()
    await store.release(job["id"], job["lease_token"], delay_seconds=3600)
    job = await one()
    await store.cancel(job["id"])  # cancel requested: the worker's release ends it
    await store.release(job["id"], job["lease_token"])
    job = await one()
    await clock.advance(10)
    assert [j["id"] for j in await store.expire_leases()] == [job["id"]]
    await one()


async def test_the_bucket_hands_out_no_more_tokens_than_it_holds(
    store: JobStore, limits: LimitStore, clock: Clock
) -> None:
    await limits.put("api:stripe", LimitSpec(concurrency=None, rate=Rate(3, 30.0)))
    await _submit(store, 20, "api:stripe")
    first = await _claim(store)
    for job in first:  # finishing frees no tokens
        await store.complete(job["id"], job["lease_token"])
    assert len(first) == 3
    assert await _claim(store) == []
    # 0.1 token a second: what a second of a slow machine refills at most
    assert (await limits.usage("api:stripe"))["tokens"] == pytest.approx(0, abs=0.1)
    await clock.advance(10.5)  # one token back (3 per 30 s)
    assert len(await _claim(store)) == 1
    await clock.advance(3600)  # never more than the bucket's capacity
    assert len(await _claim(store)) == 3


async def test_backlogged_lanes_are_served_round_robin(store: JobStore, limits: LimitStore) -> None:
    await limits.put("unrelated", LimitSpec(concurrency=1, rate=None))
    await _submit(store, 40, "big")
    await _submit(store, 10, "small")
    assert _lanes(await _claim(store, max_jobs=10)) == {"big": 5, "small": 5}


async def test_concurrent_claimers_never_exceed_a_limit(
    db_url: str, store: JobStore, limits: LimitStore, pool: asyncpg.Pool
) -> None:
    await limits.put("tenant:*", LimitSpec(concurrency=3, rate=None))
    for tenant in range(4):
        await _submit(store, 30, f"tenant:{tenant}")
    peak: Counter[str] = Counter()
    running: Counter[str] = Counter()
    done = 0

    async def worker() -> None:
        nonlocal done
        while done < 120:
            jobs = await _claim(store, max_jobs=4)
            for job in jobs:
                running[job["limit_keys"][0]] += 1
            for key, n in running.items():
                peak[key] = max(peak[key], n)
            await asyncio.sleep(0.001)
            for job in jobs:
                running[job["limit_keys"][0]] -= 1
                await store.complete(job["id"], job["lease_token"])
                done += 1

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(8))), 60)
    assert set(peak) == {f"tenant:{t}" for t in range(4)}
    assert max(peak.values()) <= 3


async def test_a_claim_never_waits_for_another_making_a_keys_bucket(
    store: JobStore, limits: LimitStore, pool: asyncpg.Pool
) -> None:
    await limits.put("tenant:*", LimitSpec(concurrency=5, rate=None))
    await _submit(store, 30, "tenant:new")
    await _submit(store, 3, "tenant:other")
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            # one job of tenant:new, whose bucket row this claim makes: left uncommitted
            assert len(await conn.fetch(queries.CLAIM, [Q], None, 1, "first")) == 1
            # tenant:new's jobs past the first claim's window are tried here: the key is
            # skipped as held, the claim never waits for the first one to end (two claims
            # waiting so for each other's new keys deadlocked)
            second = await asyncio.wait_for(_claim(store, max_jobs=10), 10)
        finally:
            await tx.rollback()
    assert _lanes(second) == {"tenant:other": 3}


async def test_a_claim_holds_back_few_jobs_beyond_those_it_takes(
    store: JobStore, limits: LimitStore, pool: asyncpg.Pool
) -> None:
    await limits.put("tenant:*", LimitSpec(concurrency=1, rate=None))
    await store.submit_batch(
        [JobSubmission(queue=Q, type="t", limit_keys=[f"tenant:{n}"]) for n in range(200)]
    )
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            assert len(await conn.fetch(queries.CLAIM, [Q], None, 10, "first")) == 10
            # every job in a lane of its own, so round-robin order is the queue's: the open
            # claim holds the 10 jobs it took and 16 more it read, not four times that
            second = await _claim(store, max_jobs=500)
        finally:
            await tx.rollback()
    assert len(second) == 200 - 10 - 16


async def test_counting_a_keys_running_jobs_reads_only_that_key(
    store: JobStore, limits: LimitStore, pool: asyncpg.Pool
) -> None:
    await limits.put("tenant:*", LimitSpec(concurrency=1, rate=None))
    await store.submit_batch(
        [JobSubmission(queue=Q, type="t", limit_keys=[f"tenant:{n}"]) for n in range(2000)]
    )
    running = 0
    while got := await _claim(store, max_jobs=500):
        running += len(got)
    assert running == 2000
    async with pool.acquire() as conn, conn.transaction():
        # the claim's count of one key's RUNNING holders, through the GIN index: its
        # condition on state as evora.claim_limited() writes it, the GIN index's predicate,
        # which no other partial index of RUNNING jobs can use (`state = 'RUNNING'` lets
        # jobs_running_lease compete, and on half-full pages it won: migration 0069)
        await conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in await conn.fetch(
                "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) SELECT count(*) FROM evora.jobs"
                " WHERE state >= 'RUNNING' AND state <= 'RUNNING' AND limit_keys <> '{}'"
                " AND limit_keys && ARRAY['tenant:7']"
            )
        )
    # the whole statement's buffers: the first node's, which add up its children's
    counted = next(line for line in plan.splitlines() if "Buffers:" in line)
    pages = sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", counted))
    # the index's tree and the job's page (4 measured), whatever else runs. With GIN's
    # default pending list holding the 2,000 claimed jobs' keys, a count read that list
    # whole, and the planner read every RUNNING job instead (63 pages)
    assert pages <= 12, plan
    assert "jobs_running_limit_keys" in plan, plan


async def _claim_plan(pool: asyncpg.Pool) -> str:
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        try:
            rows = await conn.fetch(
                f"EXPLAIN (ANALYZE, TIMING OFF) {queries.CLAIM}", [Q], None, 10, "w"
            )
        finally:
            await tx.rollback()
    return "\n".join(r[0] for r in rows)


async def test_without_limits_the_claim_never_runs_the_limited_selection(
    store: JobStore, limits: LimitStore, pool: asyncpg.Pool
) -> None:
    await _submit(store, 3, "tenant:1")
    plan = await _claim_plan(pool)
    [limited] = [line for line in plan.splitlines() if "claim_limited" in line]
    assert "never executed" in limited, plan
    # estimated as the one row it is declared to return: at the default 1000 the planner
    # hashed the whole jobs table to join the claimed ids, doubling the claim's time
    assert re.search(r"\(cost=[0-9.]+ rows=1 ", limited), plan
    await limits.put("tenant:*", LimitSpec(concurrency=1, rate=None))
    plan = await _claim_plan(pool)
    [limited] = [line for line in plan.splitlines() if "claim_limited" in line]
    assert "never executed" not in limited, plan


async def test_a_dispatcher_learns_when_an_empty_bucket_has_a_token_again(
    store: JobStore, limits: LimitStore, clock: Clock
) -> None:
    assert await store.seconds_until_due([Q]) is None
    await limits.put("api:x", LimitSpec(concurrency=None, rate=Rate(2, 20.0)))
    await _submit(store, 5, "api:x")
    assert len(await _claim(store)) == 2
    # one token per 10 s: the queue is worth a claim again then, not at the next poll
    assert await store.seconds_until_due([Q]) == pytest.approx(10, abs=0.5)
    await clock.advance(10.5)
    assert await store.seconds_until_due([Q]) is None
    assert len(await _claim(store)) == 1


async def test_a_claim_that_began_earlier_never_moves_the_bucket_back_in_time(
    store: JobStore, limits: LimitStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    """A claim's transaction began before another claim took tokens from the same bucket, and
    takes its own after that one committed: the bucket stays at the later time, so the
    interval between the two is credited once."""
    await limits.put("api:slow", LimitSpec(concurrency=None, rate=Rate(10, 100.0)))  # 0.1/s
    await _submit(store, 20, "api:slow")
    assert len(await _claim(store, max_jobs=8)) == 8  # 2 tokens left

    async def refilled_at() -> Any:
        return await pool.fetchval(
            "SELECT refilled_at FROM evora.flow_buckets WHERE key = 'api:slow'"
        )

    async with pool.acquire() as early:
        tx = early.transaction()
        await tx.start()  # its evora.clock_now() is this moment, and stays so
        try:
            await clock.advance(10)  # one token more, for claims that begin from now on
            assert len(await _claim(store, max_jobs=1)) == 1  # 2 + 1 - 1 = 2 left
            later = await refilled_at()
            # the early claim locks the bucket only now, 10 s after its transaction began
            assert len(await early.fetch(queries.CLAIM, [Q], None, 1, "early")) == 1
            await tx.commit()
        except BaseException:
            await tx.rollback()
            raise
    assert await refilled_at() >= later
    # 1 token left: 10 at first and 1 for the 10 s since, 10 taken. A bucket moved back
    # credited those 10 s again, and handed out a 12th token here
    assert len(await _claim(store)) == 1


async def test_racing_claimers_never_move_a_bucket_back_nor_exceed_it(
    store: JobStore, limits: LimitStore, pool: asyncpg.Pool
) -> None:
    """Natural race, autocommit statements only: claimers and a submitter at once, against a
    bucket of 10 at 20/s (`api:busy`, empty most of the time) and one that always has
    tokens (`api:free`, so every claim of its jobs writes the bucket). No bucket's time ever
    goes back (a trigger of this test's own notes each time it does), no more jobs of
    `api:busy` start than its bucket allows between its first and its last refill, and
    every job a claim answers with is running."""
    await pool.execute(
        """
        CREATE TABLE bucket_moved_back (key text, refilled_at timestamptz, back_to timestamptz);
        CREATE FUNCTION note_bucket_moved_back() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.refilled_at < OLD.refilled_at THEN
                INSERT INTO bucket_moved_back VALUES (NEW.key, OLD.refilled_at, NEW.refilled_at);
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER note_bucket_moved_back BEFORE UPDATE ON evora.flow_buckets
            FOR EACH ROW EXECUTE FUNCTION note_bucket_moved_back();
        """
    )
    await limits.put("api:busy", LimitSpec(concurrency=None, rate=Rate(10, 0.5)))
    await limits.put("api:free", LimitSpec(concurrency=None, rate=Rate(1_000_000, 1.0)))
    await _submit(store, 1, "api:busy")
    assert len(await _claim(store)) == 1  # makes the bucket, full
    began = await pool.fetchval("SELECT refilled_at FROM evora.flow_buckets WHERE key = 'api:busy'")
    claimed: Counter[str] = Counter(["api:busy"])
    stop = asyncio.Event()

    async def claimer() -> None:
        while not stop.is_set():
            jobs = await _claim(store, max_jobs=3)
            claimed.update(j["limit_keys"][0] for j in jobs)

    async def submitter() -> None:
        for _ in range(40):
            await _submit(store, 5, "api:busy")
            await _submit(store, 20, "api:free")
        stop.set()

    await asyncio.wait_for(asyncio.gather(submitter(), *(claimer() for _ in range(6))), 60)
    ended = await pool.fetchval("SELECT refilled_at FROM evora.flow_buckets WHERE key = 'api:busy'")
    running = await pool.fetchval("SELECT count(*) FROM evora.jobs WHERE state = 'RUNNING'")
    assert running == claimed.total()
    assert await pool.fetch("SELECT * FROM bucket_moved_back") == []
    # the bucket began full (10) and refilled 20 a second from `began` to its last refill
    allowed = 10 + 20 * (ended - began).total_seconds()
    assert claimed["api:busy"] <= allowed + 1e-6, (claimed, allowed)


async def test_racing_claimers_spend_one_token_per_job_they_claim(
    store: JobStore, limits: LimitStore, pool: asyncpg.Pool
) -> None:
    """Natural race, autocommit statements only: claimers while jobs are submitted, against a
    bucket whose refill is negligible (1,000,000 a year), so the tokens it lost are the
    tokens spent. A submission that commits after a claim statement began but before the
    claim's function read its window is found by the function: it must be claimed too."""
    await limits.put("api:paid", LimitSpec(concurrency=None, rate=Rate(1_000_000, 31_536_000.0)))
    claimed = 0
    stop = asyncio.Event()

    async def claimer() -> None:
        nonlocal claimed
        while not stop.is_set():
            jobs = await _claim(store, max_jobs=4)
            claimed += len(jobs)

    async def submitter() -> None:
        for _ in range(150):
            await _submit(store, 2, "api:paid")
        stop.set()

    await asyncio.wait_for(asyncio.gather(submitter(), *(claimer() for _ in range(6))), 60)
    tokens = (await limits.usage("api:paid"))["tokens"]
    assert (1_000_000 - tokens) == pytest.approx(claimed, abs=0.5), (tokens, claimed)


@asynccontextmanager
async def _claim_waiting_in_its_first_round(
    store: JobStore, limits: LimitStore, pool: asyncpg.Pool
) -> AsyncIterator[asyncio.Task[list[dict[str, Any]]]]:
    """A limited claim of one job, begun and left waiting in its first round, until the
    block ends: its first window (the 1 job wanted and 16 more) is of jobs holding `held`,
    whose bucket row another transaction is making. The key is then blocked, and the
    claim's next round reads on, under a newer snapshot than the claim statement's own,
    what the block made claimable (due, and after the held jobs in the queue's order)."""
    await limits.put("held", LimitSpec(concurrency=5, rate=None))
    await _submit(store, 17, "held")
    async with pool.acquire() as other:
        tx = other.transaction()
        await tx.start()
        try:
            await other.execute(
                "INSERT INTO evora.flow_buckets (key, tokens, refilled_at) VALUES ('held', 0,"
                " now())"
            )
            claim = asyncio.create_task(_claim(store, max_jobs=1))

            async def waits_for_the_row() -> bool:
                return bool(
                    await pool.fetchval(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    )
                )

            await until(waits_for_the_row, "the claim waits for the bucket row of held")
            yield claim
            await tx.commit()
        except BaseException:
            await tx.rollback()
            raise


async def test_a_claim_pays_only_for_the_jobs_it_claims(
    store: JobStore, limits: LimitStore, pool: asyncpg.Pool
) -> None:
    """A job submitted while the limited claim runs, due at once, is found by a later round
    of it and paid for, so it must be the claim's too."""
    await limits.put("paid", LimitSpec(concurrency=None, rate=Rate(100, 3600.0)))
    async with _claim_waiting_in_its_first_round(store, limits, pool) as claim:
        [paid] = await store.submit_batch(
            [
                JobSubmission(
                    queue=Q,
                    type="t",
                    limit_keys=["paid"],
                    priority=1,
                    run_at=datetime.now(UTC) - timedelta(hours=1),
                )
            ]
        )
    jobs = await asyncio.wait_for(claim, 10)
    tokens = (await limits.usage("paid"))["tokens"]
    assert ([j["id"] for j in jobs], tokens) == ([paid.id], pytest.approx(99, abs=0.5))
    assert (await store.get(paid.id))["state"] == "RUNNING"


async def test_a_job_released_while_the_limited_claim_runs_comes_with_its_dependency_results(
    store: JobStore, limits: LimitStore, pool: asyncpg.Pool
) -> None:
    """The dependency that releases a job completes while the limited claim runs: a later
    round claims the job, and the results come from a snapshot that shows the completion
    (the claim statement's own predates it)."""
    [submitted] = await store.submit_batch([JobSubmission(queue="parents", type="t")])
    [child] = await store.submit_batch(
        [JobSubmission(queue=Q, type="t", priority=1, depends_on=[submitted.id])]
    )
    [parent] = await _claim(store, queue="parents")
    async with _claim_waiting_in_its_first_round(store, limits, pool) as claim:
        await store.complete(parent["id"], parent["lease_token"], {"rows": 3})
    jobs = await asyncio.wait_for(claim, 10)
    assert [(j["id"], j["dependency_results"]) for j in jobs] == [
        (child.id, {str(submitted.id): {"rows": 3}})
    ]
