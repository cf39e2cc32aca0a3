"""Cancel, retry and discard answer from their own statement whether they moved the job,
refused it (with the state that refused) or found no such job: one round trip decides, also
when the job moved meanwhile in a transaction the statement waited for."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from uuid import UUID

import asyncpg
import pytest

from evora.domain.errors import InvalidState, JobNotFound
from evora.protocol.jobs import JobSubmission
from evora.protocol.states import JobState
from evora.storage import queries
from evora.storage.db import create_pool, jsonb_elements
from evora.storage.jobs import Cancelled, Failure, JobStore
from tests.polling import until


async def dead_lettered(store: JobStore, queue: str) -> UUID:
    submitted = await store.submit(JobSubmission(queue=queue, type="t", max_attempts=1))
    [job] = await store.claim(worker_id="w", queues=[queue])
    await store.fail(Failure(job["id"], job["lease_token"], "boom"))
    job_id: UUID = submitted.job["id"]
    return job_id


async def test_cancel_decides_in_one_statement(counted_store: JobStore, logged: list[str]) -> None:
    store = counted_store
    pending = (await store.submit(JobSubmission(queue="admin-cancel", type="t"))).job["id"]
    logged.clear()

    cancelled = await store.cancel(pending)
    assert cancelled.immediate and cancelled.job["state"] == JobState.CANCELLED
    with pytest.raises(InvalidState, match="CANCELLED"):
        await store.cancel(pending)
    with pytest.raises(JobNotFound):
        await store.cancel(uuid.uuid4())

    assert logged == [queries.CANCEL] * 3


async def test_a_repeated_cancel_of_a_running_job_answers_the_job(
    counted_store: JobStore, logged: list[str]
) -> None:
    store = counted_store
    await store.submit(JobSubmission(queue="admin-running", type="t"))
    [job] = await store.claim(worker_id="w", queues=["admin-running"])
    logged.clear()

    first, again = await store.cancel(job["id"]), await store.cancel(job["id"])

    assert not first.immediate and not again.immediate
    assert again.job["cancel_requested"] and again.job["state"] == JobState.RUNNING
    assert logged == [queries.CANCEL] * 2


@pytest.mark.parametrize(
    ("verb", "moved_to"), [("retry", JobState.PENDING), ("discard", JobState.CANCELLED)]
)
async def test_dlq_transitions_decide_in_one_statement(
    counted_store: JobStore, logged: list[str], verb: str, moved_to: JobState
) -> None:
    store = counted_store
    job_id = await dead_lettered(store, f"admin-{verb}")
    act: Callable[[UUID], Awaitable[object]] = getattr(store, verb)
    logged.clear()

    moved = await act(job_id)
    assert isinstance(moved, dict) and moved["state"] == moved_to
    with pytest.raises(InvalidState, match=f"is {moved_to}; only DLQ jobs"):
        await act(job_id)
    with pytest.raises(JobNotFound):
        await act(uuid.uuid4())

    assert logged == [queries.LEAVE_DLQ] * 3


async def test_a_refusal_names_the_state_a_concurrent_transaction_committed(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """The retry's snapshot still shows the job in the DLQ; a discard moved it while the retry
    waited for its row, so only the latest version says why it is refused."""
    job_id = await dead_lettered(store, "admin-race")
    async with pool.acquire() as other:
        transaction = other.transaction()
        await transaction.start()
        await other.fetch(queries.LEAVE_DLQ, job_id, "CANCELLED", [])
        answer = asyncio.create_task(store.retry(job_id))

        async def waits_for_the_row() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            )

        await until(waits_for_the_row, "the retry waits for the row")
        await transaction.commit()
    with pytest.raises(InvalidState, match="is CANCELLED; only DLQ jobs can be retried"):
        await answer


Move = Callable[[asyncpg.Connection], Awaitable[object]]


async def _cancel_during(store: JobStore, pool: asyncpg.Pool, job_id: UUID, move: Move) -> object:
    """Cancel `job_id` while `move` holds the job's row in an open transaction that moves it:
    the cancel's snapshot shows the job before the move, its row lock waits for the move's
    commit. Answers what the cancel answered, or raised."""
    async with pool.acquire() as other:
        transaction = other.transaction()
        await transaction.start()
        await move(other)
        answer = asyncio.create_task(store.cancel(job_id))

        async def waits_for_the_row() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            )

        await until(waits_for_the_row, "the cancel waits for the row")
        await transaction.commit()
    return (await asyncio.gather(answer, return_exceptions=True))[0]


async def test_a_cancel_that_waited_for_a_claim_requests_the_cancel(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """PENDING in the cancel's snapshot, RUNNING once its row lock is granted: the cancel is
    acknowledged (202) only with cancel_requested set, for the worker to see."""
    job_id = (await store.submit(JobSubmission(queue="admin-claimed", type="t"))).job["id"]

    async def claim(conn: asyncpg.Connection) -> None:
        assert len(await conn.fetch(queries.CLAIM, ["admin-claimed"], None, 1, "w")) == 1

    answer = await _cancel_during(store, pool, job_id, claim)

    assert isinstance(answer, Cancelled), answer
    assert not answer.immediate
    assert answer.job["state"] == JobState.RUNNING and answer.job["cancel_requested"]
    stored = await store.get(job_id)
    assert stored["state"] == JobState.RUNNING and stored["cancel_requested"]


async def test_a_cancel_that_waited_for_a_waiting_job_to_be_released_cancels_it(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """WAITING in the cancel's snapshot, PENDING once its row lock is granted (its dependency
    completed meanwhile): both can be cancelled at once, and it is."""
    queue = "admin-released"
    parent = (await store.submit(JobSubmission(queue=queue, type="t"))).job["id"]
    child = await store.submit(JobSubmission(queue=queue, type="t", depends_on=[parent]))
    assert child.job["state"] == JobState.WAITING
    [running] = await store.claim(worker_id="w", queues=[queue])

    async def complete_parent(conn: asyncpg.Connection) -> None:
        [done] = await conn.fetch(
            queries.COMPLETE, [parent], [running["lease_token"]], jsonb_elements([None]), [], False
        )
        assert done["outcome"] == "done"

    answer = await _cancel_during(store, pool, child.job["id"], complete_parent)

    assert isinstance(answer, Cancelled), answer
    assert answer.immediate and answer.job["state"] == JobState.CANCELLED
    assert (await store.get(child.job["id"]))["state"] == JobState.CANCELLED


async def test_every_acknowledged_cancel_racing_claims_is_applied(db_url: str) -> None:
    """The same race left to chance, autocommit statements only: cancels and claims of the
    same jobs at once, on a pool of their own. Whatever each cancel answered is what the job
    shows afterwards (nobody acks, so nothing moves it on)."""
    queue, count = "admin-natural", 120
    pool = await create_pool(db_url, min_size=16, max_size=16)
    try:
        store = JobStore(pool)
        batch = [JobSubmission(queue=queue, type="t") for _ in range(count)]
        ids = [s.job["id"] for s in await store.submit_batch(batch)]
        # Each cancel sent beside a claim, half of them just before it and half just after.
        calls: list[Awaitable[object]] = []
        for n, job_id in enumerate(ids):
            pair = [store.cancel(job_id), store.claim(worker_id="w", queues=[queue])]
            calls += pair if n % 2 else pair[::-1]
        async with asyncio.timeout(60):
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
        assert [o for o in outcomes if isinstance(o, BaseException)] == []
        answers = [o for o in outcomes if isinstance(o, Cancelled)]
        requested = 0
        for job_id, answer in zip(ids, answers, strict=True):
            stored = await store.get(job_id)
            if answer.immediate:
                assert stored["state"] == JobState.CANCELLED, job_id
            else:
                requested += 1
                assert answer.job["cancel_requested"], job_id
                assert stored["state"] == JobState.RUNNING and stored["cancel_requested"], job_id
        print(f"cancels racing claims: {requested} of {count} acknowledged as requested")
        await store.close()
    finally:
        await pool.close()
