"""The outbox reader never skips an event, even one whose transaction took a lower seq but
committed after a higher one."""

from __future__ import annotations

from uuid import uuid4

import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage.db import connect
from evora.storage.jobs import JobStore
from evora.storage.outbox import OutboxCursor, OutboxEvent, read_events


async def _drain(pool: asyncpg.Pool, cursor: OutboxCursor, limit: int) -> list[OutboxEvent]:
    events: list[OutboxEvent] = []
    while batch := await read_events(pool, cursor, limit):
        events += batch
        cursor = batch[-1].cursor
    return events


async def test_late_commit_with_lower_seq_is_delivered(
    db_url: str, store: JobStore, pool: asyncpg.Pool
) -> None:
    slow = await connect(db_url)
    try:
        slow_tx = slow.transaction()
        await slow_tx.start()
        # The slow transaction takes its seq first...
        slow_seq = await slow.fetchval(
            "INSERT INTO job_events (job_id, job_version, queue, type, event, to_state, attempt,"
            " at, job) VALUES ($1, 1, 'q', 't', 'submitted', 'PENDING', 0, now(),"
            " jsonb_populate_record(NULL::job_image, '{}')) RETURNING seq",
            uuid4(),
        )
        # ...then a fast one takes a higher seq and commits first.
        fast = await store.submit(JobSubmission(queue="q", type="t"))
        fast_seq = await pool.fetchval(
            "SELECT seq FROM job_events WHERE job_id = $1", fast.job["id"]
        )
        assert fast_seq > slow_seq
        # A `seq > last` reader would consume fast_seq now and never look back.
        assert await read_events(pool, OutboxCursor(), 100) == []
        await slow_tx.commit()
    finally:
        await slow.close()
    delivered = await _drain(pool, OutboxCursor(), 100)
    assert sorted(e.seq for e in delivered) == sorted([slow_seq, fast_seq])


async def test_reader_pages_through_everything_in_order(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    for _ in range(5):
        await store.submit_batch([JobSubmission(queue="q", type="t") for _ in range(7)])
    events = await _drain(pool, OutboxCursor(), 4)
    assert len(events) == 35
    assert [e.cursor for e in events] == sorted(e.cursor for e in events)
    assert len({e.seq for e in events}) == 35
    first = events[0]
    assert first.event == "submitted" and first.to_state == "PENDING"
    # Resuming from any cursor yields exactly the rest.
    rest = await _drain(pool, events[9].cursor, 100)
    assert [e.seq for e in rest] == [e.seq for e in events[10:]]


async def test_each_event_carries_the_typed_job_row_after_its_change(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    await store.submit(JobSubmission(queue="q", type="t", group_key="g", payload={"big": 1}))
    [claimed] = await store.claim(worker_id="w1", queues=["q"])
    row = await pool.fetchrow("SELECT * FROM jobs WHERE id = $1", claimed["id"])
    submitted, taken = [
        (dict(r["job"].items()), r["job_version"])
        for r in await pool.fetch("SELECT job, job_version FROM job_events ORDER BY seq")
    ]
    assert (submitted[0]["state"], taken[0]["state"]) == ("PENDING", "RUNNING")
    assert submitted[0]["started_at"] is None
    image_fields = set(taken[0]) - {"payload", "result", "progress"}
    assert set(taken[0]) == image_fields  # the image stays small
    for name in image_fields:
        assert taken[0][name] == row[name], name
    assert taken[0]["version"] == taken[1] == 2
    # what the outbox reader passes on of the image
    [_, claim] = await _drain(pool, OutboxCursor(), 10)
    assert (claim.run_at, claim.started_at) == (row["run_at"], row["started_at"])


async def test_open_transaction_holds_back_later_events(
    db_url: str, store: JobStore, pool: asyncpg.Pool
) -> None:
    await store.submit(JobSubmission(queue="q", type="t"))
    blocker = await connect(db_url)
    try:
        async with blocker.transaction():
            await blocker.execute("SELECT pg_current_xact_id()")  # takes an xid, writes nothing
            await store.submit(JobSubmission(queue="q", type="t"))
            visible = await read_events(pool, OutboxCursor(), 100)
            assert len(visible) == 1
    finally:
        await blocker.close()
    assert len(await read_events(pool, OutboxCursor(), 100)) == 2
