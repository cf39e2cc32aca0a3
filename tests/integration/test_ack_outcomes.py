"""The statements a worker sends with a lease token answer every item themselves: winners
with their job, losers with why they lost (a lost lease or an unknown job), in the same round
trip, including the losers of a race with a transaction that committed while the statement
waited for it."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from evora.domain.errors import JobNotFound, LeaseLost
from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.db import jsonb_elements
from evora.storage.jobs import AckResult, Completion, Failure, JobStore
from evora.storage.rows import JobDict
from tests.conftest import Clock
from tests.polling import until

DONE, LEASE_LOST, NOT_FOUND = AckResult.DONE, AckResult.LEASE_LOST, AckResult.NOT_FOUND


async def claimed(store: JobStore, queue: str, count: int) -> list[JobDict]:
    await store.submit_batch([JobSubmission(queue=queue, type="t") for _ in range(count)])
    jobs = await store.claim(worker_id="w", queues=[queue], max_jobs=count)
    assert len(jobs) == count
    return jobs


async def test_one_statement_answers_winners_and_losers(
    counted_store: JobStore, logged: list[str]
) -> None:
    store = counted_store
    won, other, done_before = await claimed(store, "outcomes", 3)
    await store.complete(done_before["id"], done_before["lease_token"], "earlier")
    stale, unknown = uuid.uuid4(), uuid.uuid4()
    logged.clear()

    outcomes = await store.complete_many(
        [
            Completion(won["id"], won["lease_token"], "mine"),
            Completion(other["id"], stale),
            Completion(unknown, stale),
            Completion(done_before["id"], done_before["lease_token"], "again"),
            Completion(won["id"], won["lease_token"], "repeat"),
        ]
    )

    assert len(logged) == 1
    assert [o.result for o in outcomes] == [DONE, LEASE_LOST, NOT_FOUND, DONE, DONE]
    jobs = [o.job for o in outcomes]
    assert jobs[0] is not None and jobs[0]["result"] == "mine"
    assert jobs[1] is None and jobs[2] is None
    # replays answer with the job as it stands, not with what they carried
    assert jobs[3] is not None and jobs[3]["result"] == "earlier"
    assert jobs[4] is not None and jobs[4]["result"] == "mine"

    logged.clear()
    failed = await store.fail_many(
        [Failure(other["id"], other["lease_token"], "x"), Failure(unknown, stale, "y")],
        with_jobs=False,
    )
    assert len(logged) == 1
    assert [o.result for o in failed] == [DONE, NOT_FOUND]


async def test_single_operations_tell_a_lost_lease_from_an_unknown_job_in_one_statement(
    counted_store: JobStore, logged: list[str]
) -> None:
    store = counted_store
    [job] = await claimed(store, "outcomes-single", 1)
    stale = uuid.uuid4()
    for operation in (
        lambda job_id: store.heartbeat(job_id, stale),
        lambda job_id: store.release(job_id, stale),
    ):
        logged.clear()
        with pytest.raises(LeaseLost):
            await operation(job["id"])
        with pytest.raises(JobNotFound):
            await operation(uuid.uuid4())
        assert len(logged) == 2


@pytest.mark.parametrize(
    ("concurrent", "expected"),
    [
        # the same completion, retried while the first was still in flight: a replay
        ("complete", DONE),
        # the worker handed the job back meanwhile: the lease is gone
        ("release", LEASE_LOST),
        # the sweeper expired the lease meanwhile: the lease is gone
        ("expire", LEASE_LOST),
        # an admin asked for a cancel meanwhile: the job is still RUNNING under the same lease,
        # and its worker decides, so the completion wins
        ("cancel", DONE),
    ],
)
async def test_a_race_lost_to_a_transaction_that_commits_meanwhile_reads_its_outcome(
    store: JobStore, pool: asyncpg.Pool, clock: Clock, concurrent: str, expected: AckResult
) -> None:
    """The completion's snapshot still shows the job RUNNING under its token; the job moved
    while the statement waited for its row, so only the latest version tells why. The
    completion locks no row before its UPDATE (tests/integration/test_hot_path_indexes.py):
    the UPDATE waits for the other transaction itself and re-checks its token and state on
    the version that transaction committed."""
    [job] = await claimed(store, "outcomes-race", 1)
    if concurrent == "expire":
        await clock.advance(job["lease_seconds"] + 1)
    statement, args = {
        "complete": (
            queries.COMPLETE,
            ([job["id"]], [job["lease_token"]], jsonb_elements([1]), [], False),
        ),
        "release": (queries.RELEASE, (job["id"], job["lease_token"], 0.0, "released", [])),
        "expire": (queries.EXPIRE_LEASES, (10, [])),
        "cancel": (queries.CANCEL, (job["id"], [])),
    }[concurrent]
    async with pool.acquire() as other:
        transaction = other.transaction()
        await transaction.start()
        await other.fetch(statement, *args)
        answer = asyncio.create_task(
            store.complete_many([Completion(job["id"], job["lease_token"], 2)])
        )

        async def waits_for_the_row() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            )

        await until(waits_for_the_row, "the completion waits for the row")
        await transaction.commit()
    [outcome] = await answer
    assert outcome.result is expected
    if concurrent == "complete":
        assert outcome.job is not None and outcome.job["result"] == 1
    events = await pool.fetch(
        "SELECT event FROM evora.job_events WHERE job_id = $1 ORDER BY seq", job["id"]
    )
    assert [e["event"] for e in events] == {
        "complete": ["submitted", "claimed", "completed"],
        "release": ["submitted", "claimed", "released"],
        "expire": ["submitted", "claimed", "lease_expired"],
        "cancel": ["submitted", "claimed", "cancel_requested", "completed"],
    }[concurrent]
    if concurrent == "cancel":
        assert outcome.job is not None and outcome.job["result"] == 2
        assert outcome.job["cancel_requested"]


async def test_a_completion_held_open_is_skipped_by_the_sweeper_and_fences_a_stale_token(
    store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    """The owner's completion holds the job's row, uncommitted, after its lease ran out: the
    sweeper's expiry passes over the row (SKIP LOCKED), and a completion under the token of
    the attempt before is refused at once, without waiting for the owner (its token does not
    match the version its snapshot shows). The owner's completion then commits, the one
    ending of the attempt."""
    [first] = await claimed(store, "outcomes-held", 1)
    await clock.advance(first["lease_seconds"] + 1)
    [expired] = await store.expire_leases()
    assert expired["id"] == first["id"]
    await clock.advance(  # to the retry, after its backoff
        (expired["run_at"] - await pool.fetchval("SELECT evora.clock_now()")).total_seconds() + 1
    )
    [owner] = await store.claim(worker_id="w2", queues=["outcomes-held"])
    assert owner["lease_token"] != first["lease_token"]
    await clock.advance(owner["lease_seconds"] + 1)  # the owner's lease has run out too
    async with pool.acquire() as held:
        transaction = held.transaction()
        await transaction.start()
        await held.fetch(
            queries.COMPLETE, [owner["id"]], [owner["lease_token"]], jsonb_elements([1]), [], False
        )
        async with asyncio.timeout(30):
            assert await store.expire_leases() == []
            [stale] = await store.complete_many([Completion(first["id"], first["lease_token"], 2)])
        assert stale.result is LEASE_LOST
        await transaction.commit()
    job = await pool.fetchrow(
        "SELECT state::text, result, lease_token FROM evora.jobs WHERE id = $1", owner["id"]
    )
    assert job is not None
    assert (job["state"], job["result"], job["lease_token"]) == (
        "COMPLETED",
        1,
        owner["lease_token"],
    )
    events = await pool.fetch(
        "SELECT event FROM evora.job_events WHERE job_id = $1 ORDER BY seq", owner["id"]
    )
    assert [e["event"] for e in events] == [
        "submitted",
        "claimed",
        "lease_expired",
        "claimed",
        "completed",
    ]
