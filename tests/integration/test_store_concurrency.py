"""The job store under real concurrency: many asyncio tasks, each statement on its own pooled
connection, so claims, acks, submissions and sweeps truly run in parallel in PostgreSQL.

No mocks and no sleeps: tasks coordinate only through the database and asyncio primitives,
and every conclusion is drawn from what the store returned and what `job_events` recorded.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from evora.domain.errors import IdempotencyConflict, LeaseLost
from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.db import create_pool
from evora.storage.jobs import AckResult, Completion, Failure, JobStore
from evora.storage.limits import LimitSpec, LimitStore
from evora.storage.rows import JobDict
from evora.storage.submissions import Submitted
from tests.conftest import Clock
from tests.polling import until

# A hung test (a job that never becomes claimable again) fails instead of blocking the run.
RUN_TIMEOUT_S = 120.0


@asynccontextmanager
async def pooled_store(db_url: str, size: int) -> AsyncIterator[tuple[JobStore, asyncpg.Pool]]:
    """A store on a pool with `size` connections opened up front, so that `size` tasks
    really hold `size` server sessions at once."""
    pool = await create_pool(db_url, min_size=size, max_size=size)
    try:
        yield JobStore(pool), pool
    finally:
        await pool.close()


async def run_all(tasks: list[Awaitable[Any]]) -> list[Any]:
    async with asyncio.timeout(RUN_TIMEOUT_S):
        return await asyncio.gather(*tasks)


async def submit_in_batches(
    store: JobStore, submissions: list[JobSubmission], batch_size: int
) -> list[UUID]:
    ids: list[UUID] = []
    for start in range(0, len(submissions), batch_size):
        # ids only: the jobs are read back through the claims
        results = await store.submit_batch(submissions[start : start + batch_size], with_jobs=False)
        assert all(r.created for r in results)
        ids.extend(r.id for r in results)
    return ids


# -- 1. every job is claimed exactly once ---------------------------------------------------

CLAIM_JOBS = 5_000
CLAIMERS = 16


async def test_concurrent_claimers_claim_every_job_exactly_once(db_url: str) -> None:
    queue = "exactly-once"
    async with pooled_store(db_url, CLAIMERS) as (store, pool):
        submissions = [
            JobSubmission(queue=queue, type="t", payload={"n": n}) for n in range(CLAIM_JOBS)
        ]
        all_ids = await submit_in_batches(store, submissions, 1000)
        assert len(set(all_ids)) == CLAIM_JOBS

        start = asyncio.Barrier(CLAIMERS)

        async def claimer(index: int) -> list[UUID]:
            rng = random.Random(index)
            worker = f"worker-{index}"
            claimed: list[UUID] = []
            await start.wait()
            while True:
                jobs = await store.claim(
                    worker_id=worker, queues=[queue], max_jobs=rng.randint(1, 50)
                )
                if not jobs:
                    return claimed
                for job in jobs:
                    assert job["state"] == "RUNNING"
                    assert job["worker_id"] == worker
                claimed.extend(job["id"] for job in jobs)
                outcomes = await store.complete_many(
                    [Completion(job["id"], job["lease_token"], {"by": worker}) for job in jobs]
                )
                assert [o.result for o in outcomes] == [AckResult.DONE] * len(jobs)
                assert all(o.job is not None and o.job["state"] == "COMPLETED" for o in outcomes)

        per_claimer: list[list[UUID]] = await run_all([claimer(i) for i in range(CLAIMERS)])

        for index, claimed in enumerate(per_claimer):
            assert len(claimed) == len(set(claimed)), f"worker-{index} got a job twice"
        every_claim = [job_id for claimed in per_claimer for job_id in claimed]
        assert len(every_claim) == CLAIM_JOBS, "some job was claimed by two claimers"
        assert set(every_claim) == set(all_ids)
        # Not a proof of parallelism, but with 16 claimers one of them doing all the work
        # would mean the test did not exercise anything.
        assert sum(1 for claimed in per_claimer if claimed) > 1

        claimed_by = {
            job_id: f"worker-{index}"
            for index, claimed in enumerate(per_claimer)
            for job_id in claimed
        }
        events = await pool.fetch(
            "SELECT job_id, worker_id FROM evora.job_events WHERE event = 'claimed' AND queue = $1",
            queue,
        )
        per_job = Counter(e["job_id"] for e in events)
        assert len(events) == CLAIM_JOBS
        assert set(per_job) == set(all_ids)
        assert set(per_job.values()) == {1}
        assert all(claimed_by[e["job_id"]] == e["worker_id"] for e in events)

        states = await pool.fetch("SELECT state::text, count(*) FROM evora.jobs GROUP BY state")
        assert {r["state"]: r["count"] for r in states} == {"COMPLETED": CLAIM_JOBS}
        completed_events = await pool.fetchval(
            "SELECT count(DISTINCT job_id) FROM evora.job_events WHERE event = 'completed'"
        )
        assert completed_events == CLAIM_JOBS


# -- 2. group_key: one running job per group, started in submission order -------------------

GROUPS = 50
JOBS_PER_GROUP = 20
GROUP_CLAIMERS = 8
FAIL_PROBABILITY = 0.4


class Progress:
    """Completions so far, and a generation bumped after every ack, so a claimer that found
    nothing waits (without polling) until another claimer's ack may have made work claimable.

    The generation is read before claiming: an ack that commits after the claim's snapshot
    bumps it after the read, so no wake-up is lost."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.completed = 0
        self.generation = 0
        self._changed = asyncio.Condition()

    @property
    def done(self) -> bool:
        return self.completed >= self.total

    async def acked(self, completed: int) -> None:
        async with self._changed:
            self.completed += completed
            self.generation += 1
            self._changed.notify_all()

    async def wait_past(self, generation: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.generation != generation or self.done)


async def test_group_jobs_run_one_at_a_time_in_submission_order(db_url: str) -> None:
    queue = "grouped"
    total = GROUPS * JOBS_PER_GROUP
    async with pooled_store(db_url, GROUP_CLAIMERS) as (store, pool):
        # Interleaved: index 0 of every group, then index 1 of every group, ...
        submissions = [
            JobSubmission(
                queue=queue,
                type="t",
                payload={"group": group, "index": index},
                group_key=f"g{group}",
                max_attempts=1000,
            )
            for index in range(JOBS_PER_GROUP)
            for group in range(GROUPS)
        ]
        ids = await submit_in_batches(store, submissions, total)
        position = {
            job_id: (s.group_key, s.payload["index"])
            for job_id, s in zip(ids, submissions, strict=True)
        }

        progress = Progress(total)
        start = asyncio.Barrier(GROUP_CLAIMERS)

        async def claimer(index: int) -> tuple[int, int]:
            rng = random.Random(1000 + index)
            worker = f"worker-{index}"
            completes = fails = 0
            await start.wait()
            while not progress.done:
                generation = progress.generation
                jobs = await store.claim(
                    worker_id=worker, queues=[queue], max_jobs=rng.randint(1, 50)
                )
                if not jobs:
                    await progress.wait_past(generation)
                    continue
                groups = [job["group_key"] for job in jobs]
                assert len(groups) == len(set(groups)), f"one claim took a group twice: {groups}"
                to_fail = [job for job in jobs if rng.random() < FAIL_PROBABILITY]
                to_complete = [job for job in jobs if job not in to_fail]
                completed = await store.complete_many(
                    [Completion(job["id"], job["lease_token"]) for job in to_complete]
                )
                failed = await store.fail_many(
                    [
                        Failure(job["id"], job["lease_token"], "boom", retry_in_seconds=0)
                        for job in to_fail
                    ]
                )
                assert [o.result for o in completed + failed] == [AckResult.DONE] * len(jobs)
                assert all(o.job is not None and o.job["state"] == "PENDING" for o in failed)
                completes += len(to_complete)
                fails += len(to_fail)
                await progress.acked(len(to_complete))
            return completes, fails

        tallies: list[tuple[int, int]] = await run_all([claimer(i) for i in range(GROUP_CLAIMERS)])
        assert sum(c for c, _ in tallies) == total
        assert sum(f for _, f in tallies) > 0, "no failure happened: retries were not exercised"

        states = await pool.fetch("SELECT state::text, count(*) FROM evora.jobs GROUP BY state")
        assert {r["state"]: r["count"] for r in states} == {"COMPLETED": total}

        events = await pool.fetch(
            "SELECT seq, job_id, event, worker_id FROM evora.job_events WHERE queue = $1 ORDER"
            " BY seq",
            queue,
        )
        running: dict[str, UUID] = {}
        first_claims: dict[str, list[int]] = defaultdict(list)
        seen: set[UUID] = set()
        claim_workers: set[str] = set()
        for event in events:
            group, index = position[event["job_id"]]
            assert group is not None
            name = event["event"]
            if name == "claimed":
                assert group not in running, (
                    f"seq {event['seq']}: {group} job {index} claimed while job "
                    f"{position[running[group]][1]} of the group was running"
                )
                running[group] = event["job_id"]
                claim_workers.add(event["worker_id"])
                if event["job_id"] not in seen:
                    seen.add(event["job_id"])
                    first_claims[group].append(index)
            elif name in ("completed", "failed"):
                assert running.get(group) == event["job_id"], (
                    f"seq {event['seq']}: {name} of {group} job {index}, which was not running"
                )
                del running[group]
            else:
                assert name == "submitted", f"unexpected event {name!r}"
        assert not running
        assert len(first_claims) == GROUPS
        for group, order in first_claims.items():
            assert order == list(range(JOBS_PER_GROUP)), f"{group} started out of order: {order}"
        assert len(claim_workers) > 1, "only one claimer ever claimed: no concurrency exercised"


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "limited"])
async def test_a_claim_that_loses_a_group_to_a_new_head_claims_the_rest(
    store: JobStore, pool: asyncpg.Pool, limited: bool
) -> None:
    """A group's head changes under a claim: the claim's snapshot shows B at the head (A, before
    it in the group, is in the DLQ); an admin's retry puts A back at the head and another claim
    starts it, committing while the claim moves B. The claim has lost the group, not failed:
    it claims what else is claimable, and never a second job of the group."""
    if limited:  # any limit at all: the limited claim picks the jobs
        await LimitStore(pool).put("unrelated", LimitSpec(concurrency=1, rate=None))
    queue = "heads"
    first = await store.submit_batch(
        [JobSubmission(queue=queue, type="t", group_key="g", max_attempts=1)]
    )
    [a] = await store.claim(worker_id="w", queues=[queue])
    await store.fail(Failure(a["id"], a["lease_token"], "boom", retryable=False))
    [b, lone] = await store.submit_batch(
        [
            JobSubmission(queue=queue, type="t", group_key="g"),
            JobSubmission(queue=queue, type="lone"),
        ]
    )
    assert first[0].id == a["id"]
    async with pool.acquire() as other:
        tx = other.transaction()
        await tx.start()
        try:
            await other.fetch(queries.LEAVE_DLQ, a["id"], "PENDING", [])
            [row] = await other.fetch(queries.CLAIM, [queue], ["t"], 1, "other")
            assert row["job"]["id"] == a["id"]
            claim = asyncio.create_task(store.claim(worker_id="w", queues=[queue], max_jobs=5))

            async def waits_for_the_group() -> bool:
                return bool(
                    await pool.fetchval(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    )
                )

            # B's index entry waits for A's transaction: one RUNNING job per group
            await until(waits_for_the_group, "the claim waits for the group's running job")
            await tx.commit()
        except BaseException:
            await tx.rollback()
            raise
    jobs = await asyncio.wait_for(claim, 10)
    assert [j["id"] for j in jobs] == [lone.id]
    assert (await store.get(b.id))["state"] == "PENDING"


HEAD_CHANGES = 150


async def test_group_heads_changing_under_racing_claimers_never_fail_a_claim(db_url: str) -> None:
    """Natural race, autocommit statements only: jobs submitted ahead of their groups' heads
    (a lower priority) while claimers claim and complete. Every claim answers, every job
    runs, and never two of one group at once."""
    queue = "new-heads"
    async with pooled_store(db_url, GROUP_CLAIMERS + 1) as (store, pool):
        await store.submit_batch(
            [
                JobSubmission(queue=queue, type="t", group_key=f"g{group}")
                for _ in range(5)
                for group in range(10)
            ]
        )
        progress = Progress(50 + HEAD_CHANGES)

        async def submitter() -> None:
            rng = random.Random(7)
            for _ in range(HEAD_CHANGES):
                group = f"g{rng.randrange(10)}"
                await store.submit_batch(
                    [JobSubmission(queue=queue, type="t", group_key=group, priority=-1)]
                )
                await progress.acked(0)

        async def claimer(index: int) -> None:
            rng = random.Random(index)
            while not progress.done:
                generation = progress.generation
                jobs = await store.claim(
                    worker_id=f"w{index}", queues=[queue], max_jobs=rng.randint(1, 5)
                )
                if not jobs:
                    await progress.wait_past(generation)
                    continue
                await store.complete_many([Completion(j["id"], j["lease_token"]) for j in jobs])
                await progress.acked(len(jobs))

        await run_all([submitter(), *(claimer(i) for i in range(GROUP_CLAIMERS))])
        states = await pool.fetch("SELECT state::text, count(*) FROM evora.jobs GROUP BY state")
        assert {r["state"]: r["count"] for r in states} == {"COMPLETED": 50 + HEAD_CHANGES}
        events = await pool.fetch(
            "SELECT e.event, j.group_key FROM evora.job_events e JOIN evora.jobs j ON j.id ="
            " e.job_id"
            " WHERE e.event IN ('claimed', 'completed') ORDER BY e.seq"
        )
        running: set[str] = set()
        for event in events:
            if event["event"] == "claimed":
                assert event["group_key"] not in running
                running.add(event["group_key"])
            else:
                running.remove(event["group_key"])


# -- 3. idempotency keys under racing submissions -------------------------------------------

SUBMITTERS = 50
SUBMIT_POOL = 25


async def test_racing_submissions_with_one_key_create_one_job(db_url: str) -> None:
    queue = "idem"
    submission = JobSubmission(queue=queue, type="t", payload={"a": 1}, idempotency_key="k-1")
    async with pooled_store(db_url, SUBMIT_POOL) as (store, pool):
        start = asyncio.Barrier(SUBMITTERS)

        async def submit() -> Submitted:
            await start.wait()
            return await store.submit(submission)

        results: list[Submitted] = await run_all([submit() for _ in range(SUBMITTERS)])

        assert await pool.fetchval("SELECT count(*) FROM evora.jobs") == 1
        job_id = await pool.fetchval("SELECT id FROM evora.jobs")
        assert {r.job["id"] for r in results} == {job_id}
        assert sum(r.created for r in results) == 1
        assert sum(not r.created for r in results) == SUBMITTERS - 1
        assert (
            await pool.fetchval("SELECT count(*) FROM evora.job_events WHERE event = 'submitted'")
            == 1
        )
        assert await pool.fetchval("SELECT count(*) FROM evora.job_events") == 1

        changed = submission.model_copy(update={"payload": {"a": 2}})
        with pytest.raises(IdempotencyConflict):
            await store.submit(changed)
        assert await pool.fetchval("SELECT count(*) FROM evora.jobs") == 1
        assert await pool.fetchval("SELECT count(*) FROM evora.job_events") == 1
        assert await pool.fetchval("SELECT count(*) FROM evora.idempotency_keys") == 1
        assert (await store.get(job_id))["payload"] == {"a": 1}


BATCHES = 10
KEYS_PER_BATCH = 20


async def test_racing_batches_with_shared_keys_do_not_deadlock(db_url: str) -> None:
    queue = "idem-batch"
    submissions = [
        JobSubmission(queue=queue, type="t", payload={"k": k}, idempotency_key=f"key-{k}")
        for k in range(KEYS_PER_BATCH)
    ]
    orders: list[list[int]] = []
    for seed in range(BATCHES):
        order = list(range(KEYS_PER_BATCH))
        random.Random(seed).shuffle(order)
        orders.append(order)
    assert len({tuple(o) for o in orders}) > 1

    async with pooled_store(db_url, SUBMIT_POOL) as (store, pool):
        start = asyncio.Barrier(BATCHES)

        async def submit(order: list[int]) -> list[Submitted]:
            await start.wait()
            return await store.submit_batch([submissions[k] for k in order])

        # A deadlock would surface as asyncpg.DeadlockDetectedError from gather.
        results: list[list[Submitted]] = await run_all([submit(o) for o in orders])

        assert await pool.fetchval("SELECT count(*) FROM evora.jobs") == KEYS_PER_BATCH
        assert await pool.fetchval("SELECT count(*) FROM evora.job_events") == KEYS_PER_BATCH
        rows = await pool.fetch("SELECT id, idempotency_key, payload FROM evora.jobs")
        by_key = {r["idempotency_key"]: r["id"] for r in rows}
        assert {r["idempotency_key"]: r["payload"] for r in rows} == {
            f"key-{k}": {"k": k} for k in range(KEYS_PER_BATCH)
        }

        created = Counter[str]()
        for order, batch in zip(orders, results, strict=True):
            assert len(batch) == KEYS_PER_BATCH
            for k, result in zip(order, batch, strict=True):
                assert result.job["idempotency_key"] == f"key-{k}"
                assert result.job["id"] == by_key[f"key-{k}"]
                if result.created:
                    created[f"key-{k}"] += 1
        assert created == Counter({f"key-{k}": 1 for k in range(KEYS_PER_BATCH)})


# -- 4. fencing: lease expiry against a late completion -------------------------------------

FENCE_ROUNDS = 50


async def race_expiry_with_completion(
    store: JobStore, job_id: UUID, lease_token: UUID, *, expiry_first: bool
) -> tuple[list[JobDict], JobDict | BaseException]:
    """Run the sweeper and the worker's completion at once, each on its own connection."""
    expire = store.expire_leases()
    complete = store.complete(job_id, lease_token, {"done": True})
    async with asyncio.timeout(RUN_TIMEOUT_S):
        if expiry_first:
            expired, completed = await asyncio.gather(expire, complete, return_exceptions=True)
        else:
            completed, expired = await asyncio.gather(complete, expire, return_exceptions=True)
    if isinstance(expired, BaseException):
        raise expired
    return expired, completed


async def test_expiry_and_completion_race_has_exactly_one_winner(
    db_url: str, pg_server_url: str
) -> None:
    winners: Counter[str] = Counter()
    async with pooled_store(db_url, 4) as (store, pool):
        clock = Clock(pg_server_url, db_url, [pool])
        for round_ in range(FENCE_ROUNDS):
            # A queue per round, so no earlier job (retrying after its expiry) is claimed.
            queue = f"fence-{round_}"
            submitted = await store.submit(
                JobSubmission(queue=queue, type="t", lease_seconds=1, max_attempts=5)
            )
            job_id = submitted.job["id"]
            [claimed] = await store.claim(worker_id="A", queues=[queue])
            assert claimed["id"] == job_id
            # the lease runs out. No partitions are made: all rounds together move the clock
            # FENCE_ROUNDS * 2 s, well within the 3 days of job_events' partitions that the
            # migrations made ahead; making them each round cost ~1.5 of this test's ~8.5 CPU s
            await clock.advance(claimed["lease_seconds"] + 1, partitions=False)

            expired, completed = await race_expiry_with_completion(
                store, job_id, claimed["lease_token"], expiry_first=bool(round_ % 2)
            )
            expired_ids = [job["id"] for job in expired]
            assert set(expired_ids) <= {job_id}, "expire_leases touched another job"
            job = await store.get(job_id)
            events = Counter(e["event"] for e in await store.events(job_id))

            if isinstance(completed, BaseException):
                assert isinstance(completed, LeaseLost), f"round {round_}: {completed!r}"
                winners["expiry"] += 1
                assert expired_ids == [job_id], f"round {round_}: complete lost to nobody"
                assert expired[0]["state"] == "PENDING"
                assert job["state"] == "PENDING"
                assert job["attempt"] == 1
                assert job["lease_expires_at"] is None
                assert events == Counter(submitted=1, claimed=1, lease_expired=1)
            else:
                winners["completion"] += 1
                assert completed["state"] == "COMPLETED"
                assert expired_ids == [], f"round {round_}: both the sweeper and A won"
                assert job["state"] == "COMPLETED"
                assert job["result"] == {"done": True}
                assert events == Counter(submitted=1, claimed=1, completed=1)
    assert sum(winners.values()) == FENCE_ROUNDS
    print(f"fencing race winners: {dict(winners)}")
