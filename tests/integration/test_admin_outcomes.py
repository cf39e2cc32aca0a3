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
from evora.storage.jobs import Failure, JobStore
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
