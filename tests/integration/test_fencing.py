"""Lease fencing when acks travel together: one `/v1/acks` request, or concurrent single
requests coalesced into one statement. Whatever a batch holds, exactly the item carrying
the job's current lease token changes it; every other item for that job is answered as it
would be alone; and one item the database rejects fails only itself.

These drive the store and the coalescer directly, so the batch contents are exactly what
each test says (the HTTP tests in tests/e2e/test_fencing.py race real requests).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from uuid import UUID

import asyncpg
import pytest

from evora.coalesce import Coalescer
from evora.domain.errors import EvoraError
from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import (
    AckOutcome,
    AckResult,
    Completion,
    Failure,
    JobStore,
    caused_by_an_item,
)
from evora.storage.rows import JobDict
from evora.storage.submissions import Submitted


async def claimed_jobs(store: JobStore, queue: str, count: int) -> list[JobDict]:
    await store.submit_batch(
        [JobSubmission(queue=queue, type="t", max_attempts=3) for _ in range(count)]
    )
    jobs = await store.claim(worker_id="w", queues=[queue], max_jobs=count)
    assert len(jobs) == count
    return jobs


async def event_counts(pool: asyncpg.Pool, job_id: UUID) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT event, count(*) AS n FROM evora.job_events WHERE job_id = $1 GROUP BY event", job_id
    )
    return {r["event"]: r["n"] for r in rows}


# As the dispatcher answers them.
STATUS = {AckResult.DONE: 200, AckResult.LEASE_LOST: 409, AckResult.NOT_FOUND: 404}


def statuses(outcomes: list[AckOutcome]) -> list[int]:
    return [STATUS[o.result] for o in outcomes]


@pytest.mark.parametrize("with_jobs", [True, False])
async def test_a_stranger_beside_the_owner_changes_nothing_in_either_order(
    store: JobStore, pool: asyncpg.Pool, with_jobs: bool
) -> None:
    first, second = await claimed_jobs(store, "fence-complete", 2)
    stranger = uuid.uuid4()

    owner_first = await store.complete_many(
        [Completion(first["id"], first["lease_token"], "mine"), Completion(first["id"], stranger)],
        with_jobs=with_jobs,
    )
    stranger_first = await store.complete_many(
        [
            Completion(second["id"], stranger, "theirs"),
            Completion(second["id"], second["lease_token"], "mine"),
        ],
        with_jobs=with_jobs,
    )

    assert statuses(owner_first) == [200, 409]
    assert statuses(stranger_first) == [409, 200]
    for job in (first, second):
        current = await store.get(job["id"])
        assert current["state"] == "COMPLETED"
        assert current["result"] == "mine"
        assert await event_counts(pool, job["id"]) == {"submitted": 1, "claimed": 1, "completed": 1}
    if with_jobs:
        assert owner_first[0].job is not None and owner_first[0].job["result"] == "mine"
        assert owner_first[1].job is None


async def test_every_lease_token_is_its_own_across_claims_and_attempts(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """Each claimed job gets a token of its own, unique per job and attempt: one job's token
    fences every other job out, also when two claims run at once and when the same jobs are
    claimed again after a failure (a token shared by a claim's jobs, or reused across
    attempts, fails here)."""
    await store.submit_batch(
        [JobSubmission(queue="fence-tokens", type="t", max_attempts=3) for _ in range(200)]
    )
    claims = await asyncio.gather(
        *(store.claim(worker_id=f"w{n}", queues=["fence-tokens"], max_jobs=100) for n in (1, 2))
    )
    first = [job for claim in claims for job in claim]
    assert len(first) == 200 and len({job["id"] for job in first}) == 200
    assert len({job["lease_token"] for job in first}) == 200

    # the same jobs' second attempts: none reuses a token of the first
    outcomes = await store.fail_many(
        [Failure(j["id"], j["lease_token"], "again", retry_in_seconds=0) for j in first]
    )
    assert statuses(outcomes) == [200] * 200
    again = await store.claim(worker_id="w3", queues=["fence-tokens"], max_jobs=200)
    assert len(again) == 200
    tokens = {job["lease_token"] for job in first} | {job["lease_token"] for job in again}
    assert len(tokens) == 400

    # a neighbour's token (same claim) and the job's own stale one are both refused
    a, b = again[0], again[1]
    stale = next(j["lease_token"] for j in first if j["id"] == a["id"])
    refused = await store.complete_many(
        [Completion(a["id"], b["lease_token"]), Completion(a["id"], stale)]
    )
    assert statuses(refused) == [409, 409]
    assert (await store.get(a["id"]))["state"] == "RUNNING"
    assert await event_counts(pool, a["id"]) == {"submitted": 1, "claimed": 2, "failed": 1}


async def test_fail_is_fenced_per_item_too(store: JobStore, pool: asyncpg.Pool) -> None:
    first, second = await claimed_jobs(store, "fence-fail", 2)
    stranger = uuid.uuid4()

    def failure(job: JobDict, token: UUID, message: str) -> Failure:
        return Failure(job["id"], token, message, retryable=False)

    outcomes = await store.fail_many(
        [
            failure(first, stranger, "stranger"),
            failure(first, first["lease_token"], "owner"),
            failure(second, second["lease_token"], "owner"),
            failure(second, stranger, "stranger"),
        ]
    )

    assert statuses(outcomes) == [409, 200, 200, 409]
    for job in (first, second):
        current = await store.get(job["id"])
        assert current["state"] == "DLQ"
        assert current["last_error"] == {"message": "owner", "type": None}
        assert (await event_counts(pool, job["id"]))["dead_lettered"] == 1


async def test_a_repeat_of_the_owner_in_one_batch_is_answered_as_if_sent_after(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    done, failed = await claimed_jobs(store, "fence-repeat", 2)

    completions = await store.complete_many(
        [
            Completion(done["id"], done["lease_token"], 1),
            Completion(done["id"], done["lease_token"], 2),
        ]
    )
    failures = await store.fail_many(
        [
            Failure(failed["id"], failed["lease_token"], "first"),
            Failure(failed["id"], failed["lease_token"], "second"),
        ]
    )

    # A repeated complete is a replay (200, same job); a repeated fail finds the attempt over.
    assert statuses(completions) == [200, 200]
    assert [o.job["result"] for o in completions if o.job] == [1, 1]
    assert statuses(failures) == [200, 409]
    assert (await store.get(failed["id"]))["last_error"] == {"message": "first", "type": None}
    assert (await event_counts(pool, done["id"]))["completed"] == 1
    assert (await event_counts(pool, failed["id"]))["failed"] == 1


async def test_unknown_jobs_are_404_beside_fenced_ones(store: JobStore) -> None:
    [job] = await claimed_jobs(store, "fence-404", 1)
    outcomes = await store.complete_many(
        [Completion(uuid.uuid4(), uuid.uuid4()), Completion(job["id"], job["lease_token"])],
        with_jobs=False,
    )
    assert statuses(outcomes) == [404, 200]


# -- one item the database rejects fails only itself ------------------------------------


async def test_a_coalesced_ack_the_database_rejects_fails_only_itself(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    jobs = await claimed_jobs(store, "fence-isolate", 9)
    coalescer: Coalescer[Completion, AckOutcome] = Coalescer(
        store.complete_many, isolate=caused_by_an_item
    )
    # U+0000 is valid JSON but PostgreSQL's jsonb refuses it: the whole statement fails.
    results = ["\x00" if i == 4 else i for i in range(len(jobs))]

    answers = await asyncio.gather(
        *(
            coalescer.submit(Completion(job["id"], job["lease_token"], result))
            for job, result in zip(jobs, results, strict=True)
        ),
        return_exceptions=True,
    )
    await coalescer.close()

    assert isinstance(answers[4], asyncpg.PostgresError)
    good = [a for i, a in enumerate(answers) if i != 4]
    assert all(isinstance(a, AckOutcome) and a.result is AckResult.DONE for a in good)
    states = {
        r["state"]
        for r in await pool.fetch(
            "SELECT state::text FROM evora.jobs WHERE id <> $1", jobs[4]["id"]
        )
    }
    assert states == {"COMPLETED"}
    assert (await store.get(jobs[4]["id"]))["state"] == "RUNNING"


async def test_a_coalesced_submission_the_database_rejects_fails_only_itself(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    coalescer: Coalescer[JobSubmission, Submitted | EvoraError] = Coalescer(
        store.submit_each, isolate=caused_by_an_item
    )
    submissions = [
        JobSubmission(queue="isolate-submit", type="t", payload={"n": i}) for i in range(7)
    ]
    # The edge refuses U+0000; this one slips past it (model_copy does not validate), as a
    # value no validator foresaw would.
    submissions[2] = submissions[2].model_copy(update={"payload": {"bad": "\x00"}})
    answers = await asyncio.gather(
        *(coalescer.submit(s) for s in submissions), return_exceptions=True
    )
    await coalescer.close()

    assert isinstance(answers[2], asyncpg.PostgresError)
    created = [a for a in answers if isinstance(a, Submitted)]
    assert len(created) == 6 and all(a.created for a in created)
    assert (
        await pool.fetchval("SELECT count(*) FROM evora.jobs WHERE queue = 'isolate-submit'") == 6
    )


async def test_an_unavailable_database_fails_the_batch_without_splitting() -> None:
    flushes: list[int] = []

    async def flush(items: Sequence[int]) -> list[int]:
        flushes.append(len(items))
        raise ConnectionResetError("the database went away")

    coalescer: Coalescer[int, int] = Coalescer(flush, isolate=caused_by_an_item)
    answers = await asyncio.gather(*(coalescer.submit(i) for i in range(8)), return_exceptions=True)
    await coalescer.close()
    assert all(isinstance(a, ConnectionResetError) for a in answers)
    # Each item was tried once: a failure that is not about an item's values is not split.
    assert sum(flushes) == 8
