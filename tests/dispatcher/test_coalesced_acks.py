"""Concurrent single acks are coalesced into one statement (evora.coalesce), yet each waits on
its own locks only: a job an application's open transaction holds stalls the ack of that
job, never the acks that happened to share its statement or came after it."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import orjson

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import JobStore
from tests.dispatcher.conftest import Dispatcher
from tests.polling import until


async def running(d: Dispatcher, store: JobStore, count: int) -> list[dict[str, Any]]:
    await store.submit_batch([JobSubmission(queue="q", type="t") for _ in range(count)])
    status, answer = await d.post(
        "/v1/claim", {"worker_id": "w", "queues": ["q"], "max_jobs": count, "wait_seconds": 0}
    )
    assert status == 200 and len(answer["jobs"]) == count, answer
    jobs: list[dict[str, Any]] = answer["jobs"]
    return jobs


async def complete(d: Dispatcher, job: dict[str, Any]) -> tuple[int, Any]:
    return await d.post(
        f"/v1/jobs/{job['id']}/complete", {"lease_token": job["lease_token"], "result": 1}
    )


async def test_a_job_held_by_an_open_sql_transaction_stalls_only_its_own_ack(
    dispatcher: Dispatcher, store: JobStore, db_url: str
) -> None:
    parent, *others = await running(dispatcher, store, 11)
    app = await asyncpg.connect(db_url)
    watch = await asyncpg.connect(db_url)
    try:
        held = app.transaction()
        await held.start()
        # An application submits a dependent of the RUNNING parent in SQL and keeps its
        # transaction open.
        await app.fetchval(
            "SELECT evora.submit('later', 't', '{}', $1::jsonb)",
            orjson.dumps({"depends_on": [parent["id"]]}).decode(),
        )
        contended = asyncio.create_task(complete(dispatcher, parent))
        # Sent together with the parent's ack: they may share its statement.
        beside = [asyncio.create_task(complete(dispatcher, job)) for job in others[:5]]

        async def waiting() -> bool:
            count: int = await watch.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            )
            return count > 0

        await until(waiting, "the parent's ack waits for the held dependent")
        # Sent while the parent's ack waits: they come after it.
        behind = [asyncio.create_task(complete(dispatcher, job)) for job in others[5:]]
        unrelated = await asyncio.gather(*beside, *behind)

        assert [status for status, _ in unrelated] == [200] * 10, unrelated
        assert all(job["state"] == "COMPLETED" for _, job in unrelated)
        assert not contended.done()
        await held.commit()
    finally:
        await app.close()
        await watch.close()
    # The parent's ack is answered once the transaction ends.
    status, job = await contended
    assert status == 200 and job["state"] == "COMPLETED", job
