"""A request whose transaction PostgreSQL aborts to break a deadlock (or a serialization
failure) changed nothing: it is answered 503 `unavailable` with Retry-After, as a database
that is briefly unavailable is, never 500; sent again, it succeeds. The deadlock here is
real: another session holds one job's row and then asks for the row the request holds."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.jobs import Failure, JobStore
from tests.dispatcher.conftest import WORKER, Dispatcher
from tests.dispatcher.test_claim_acks import complete
from tests.dispatcher.test_worker_api import claim, submit
from tests.polling import until


async def _waits_for_a_lock(conn: asyncpg.Connection, other: int) -> bool:
    waiting = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> $1",
        other,
    )
    return bool(waiting)


async def _locked_elsewhere(db_url: str, job_id: str) -> bool:
    conn = await asyncpg.connect(db_url)
    try:
        async with conn.transaction():
            await conn.execute(
                "SELECT 1 FROM evora.jobs WHERE id = $1 FOR UPDATE NOWAIT", UUID(job_id)
            )
        return False
    except asyncpg.LockNotAvailableError:
        return True
    finally:
        await conn.close()


async def _post(d: Dispatcher, body: Any) -> tuple[int, dict[str, str], Any]:
    async with d.http.post(d.url + "/v1/acks", json=body, headers=WORKER) as response:
        return response.status, dict(response.headers), await response.json(content_type=None)


async def test_a_request_chosen_as_a_deadlock_victim_is_answered_503_and_loses_nothing(
    dispatcher: Dispatcher, store: JobStore, db_url: str
) -> None:
    for _ in range(2):
        await submit(store, max_attempts=1)
    first, second = await claim(dispatcher, max_jobs=2)
    acks = {"acks": [complete(first), complete(second)]}
    other = await asyncpg.connect(db_url)
    try:
        async with other.transaction():
            # The request's session detects the deadlock (after the server's 1 s
            # deadlock_timeout) long before this one would: it is the one aborted.
            await other.execute("SET LOCAL deadlock_timeout = '60s'")
            await other.execute(
                "SELECT 1 FROM evora.jobs WHERE id = $1 FOR UPDATE", UUID(second["id"])
            )
            answering = asyncio.ensure_future(_post(dispatcher, acks))
            watcher = await asyncpg.connect(db_url)
            try:
                await until(
                    lambda: _waits_for_a_lock(watcher, other.get_server_pid()),
                    "the acks wait for the second job's row",
                )
            finally:
                await watcher.close()
            # The acks hold the first job's row (settled in item order) while they wait.
            assert await _locked_elsewhere(db_url, first["id"])
            await other.execute(
                "SELECT 1 FROM evora.jobs WHERE id = $1 FOR UPDATE", UUID(first["id"])
            )
            status, headers, problem = await answering
    finally:
        await other.close()
    assert status == 503, problem
    assert problem["code"] == "unavailable"
    assert "conflict with a concurrent one" in problem["detail"]  # not a timeout's 503
    assert headers.get("Retry-After") == "1"
    assert headers["Content-Type"].startswith("application/problem+json")
    # Nothing of the aborted request stuck, and sending it again settles both.
    for job in (first, second):
        assert (await store.get(UUID(job["id"])))["state"] == "RUNNING"
    status, _, answer = await _post(dispatcher, acks)
    assert (status, answer) == (
        200,
        {"results": [{"id": first["id"], "status": 200}, {"id": second["id"], "status": 200}]},
    )


async def test_a_claim_that_loses_a_group_to_a_new_head_is_answered_with_the_rest(
    dispatcher: Dispatcher, store: JobStore, db_url: str
) -> None:
    """Not a conflict PostgreSQL settles by aborting, but one the claim settles itself: the
    group's head changed under it (an admin's retry put the DLQ head back, and another
    claim started it), so jobs_group_running refused the job it picked. It is answered 200
    with what else is claimable, never 500 (tests/integration/test_store_concurrency.py)."""
    head = await submit(store, group_key="g", max_attempts=1)
    [running] = await claim(dispatcher)
    assert running["id"] == head
    await store.fail(Failure(UUID(head), UUID(running["lease_token"]), "boom", retryable=False))
    second = await submit(store, group_key="g")
    # the other claim takes type t only
    lone = str((await store.submit(JobSubmission(queue="q", type="lone"))).job["id"])
    other = await asyncpg.connect(db_url)
    try:
        async with other.transaction():
            await other.fetch(queries.LEAVE_DLQ, UUID(head), "PENDING", [])
            [row] = await other.fetch(queries.CLAIM, ["q"], ["t"], 1, "other")
            assert str(row["job"]["id"]) == head
            answering = asyncio.ensure_future(
                dispatcher.post(
                    "/v1/claim",
                    {"worker_id": "w1", "queues": ["q"], "wait_seconds": 0, "max_jobs": 5},
                )
            )
            watcher = await asyncpg.connect(db_url)
            try:
                await until(
                    lambda: _waits_for_a_lock(watcher, other.get_server_pid()),
                    "the claim waits for the group's running job",
                )
            finally:
                await watcher.close()
    finally:
        await other.close()
    status, answer = await answering
    assert status == 200, answer
    assert [j["id"] for j in answer["jobs"]] == [lone]
    assert (await store.get(UUID(second)))["state"] == "PENDING"
