"""Admission control in SQL (docs/sql-enqueue.md, docs/flow-control.md "Admission"):
evora.submit raises SQLSTATE EV429 (DETAIL: the key) when a key would hold more jobs waiting
than its max_pending. Admissions of one key are serialised by a lock held to the end of the
transaction that stores the jobs: one held open makes the next wait, then count its jobs; two
batches locking the same keys from different item orders never deadlock."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import orjson
import pytest

from tests.polling import until

QUEUE = "orders"
SUBMIT = "SELECT evora.submit($1, 't', '{}', $2::text::jsonb)"
SUBMIT_BATCH = "SELECT evora.submit_batch($1::text::jsonb)"


def options(*keys: str) -> str:
    return orjson.dumps({"limit_keys": list(keys)}).decode()


def batch(*keys: str) -> str:
    jobs: list[dict[str, Any]] = [
        {"queue": QUEUE, "type": "t", "limit_keys": [key]} for key in keys
    ]
    return orjson.dumps(jobs).decode()


async def put_limit(conn: asyncpg.Connection, key: str, max_pending: int) -> None:
    await conn.execute(
        "INSERT INTO evora.flow_limits (key, max_pending) VALUES ($1, $2) "
        "ON CONFLICT (key) DO UPDATE SET max_pending = excluded.max_pending",
        key,
        max_pending,
    )


async def holding(conn: asyncpg.Connection, key: str) -> int:
    count: int = await conn.fetchval(
        "SELECT count(*) FROM evora.jobs WHERE $1 = ANY(limit_keys)", key
    )
    return count


async def waiting_for_a_lock(conn: asyncpg.Connection, pid: int) -> bool:
    state: bool = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)", pid
    )
    return state


async def test_submit_over_max_pending_raises_ev429_naming_the_key(
    app_conn: asyncpg.Connection,
) -> None:
    await put_limit(app_conn, "tenant:*", 1)
    await app_conn.fetchval(SUBMIT, QUEUE, options("tenant:1"))
    await app_conn.fetchval(SUBMIT, QUEUE, options("tenant:2"))
    with pytest.raises(asyncpg.PostgresError) as raised:
        await app_conn.fetchval(SUBMIT, QUEUE, options("tenant:1"))
    assert raised.value.sqlstate == "EV429"
    assert raised.value.detail == "tenant:1"
    assert str(raised.value).startswith("queue_full: key 'tenant:1' has 1 jobs waiting")
    with pytest.raises(asyncpg.PostgresError) as raised:
        await app_conn.fetchval(SUBMIT_BATCH, batch("tenant:3", "tenant:2"))
    assert (raised.value.sqlstate, raised.value.detail) == ("EV429", "tenant:2")
    assert await holding(app_conn, "tenant:3") == 0  # the batch stored nothing

    # Lowered below the depth: allowed, and refuses until claims bring the depth below it.
    await put_limit(app_conn, "queue:q2", 3)
    for _ in range(3):
        await app_conn.fetchval("SELECT evora.submit('q2', 't')")
    await put_limit(app_conn, "queue:q2", 1)
    with pytest.raises(asyncpg.PostgresError) as raised:
        await app_conn.fetchval("SELECT evora.submit('q2', 't')")
    assert str(raised.value).startswith("queue_full: key 'queue:q2' has over 1 jobs waiting")


@pytest.mark.parametrize("isolation", ["repeatable_read", "serializable"])
async def test_only_read_committed_submits_to_a_key_with_max_pending(
    app_conn: asyncpg.Connection, isolation: str
) -> None:
    """Its count would be the transaction's first snapshot, which may miss an admission
    committed since; SERIALIZABLE does not catch that against the api's READ COMMITTED
    transactions (tried: the late transaction committed a job over the limit)."""
    await put_limit(app_conn, "k", 5)
    async with app_conn.transaction(isolation=isolation):
        await app_conn.fetchval(SUBMIT, QUEUE, options("other"))  # no max_pending: fine
        with pytest.raises(asyncpg.FeatureNotSupportedError):
            await app_conn.fetchval(SUBMIT, QUEUE, options("k"))


@pytest.mark.parametrize("holder_commits", [True, False])
async def test_a_held_admission_makes_the_next_wait_and_count_its_jobs(
    app_conn: asyncpg.Connection, db_url: str, holder_commits: bool
) -> None:
    await put_limit(app_conn, "k", 2)
    await app_conn.fetchval(SUBMIT, QUEUE, options("k"))
    holder = await asyncpg.connect(db_url)
    other = await asyncpg.connect(db_url)
    try:
        held = holder.transaction()
        await held.start()
        # the last room, taken by a transaction that stays open
        await holder.fetchval(SUBMIT, QUEUE, options("k"))
        racing = asyncio.create_task(other.fetchval(SUBMIT, QUEUE, options("k")))
        other_pid = other.get_server_pid()
        await until(lambda: waiting_for_a_lock(app_conn, other_pid))
        assert not racing.done()
        if holder_commits:
            await held.commit()
            with pytest.raises(asyncpg.PostgresError) as raised:
                await racing
            assert raised.value.sqlstate == "EV429"
            assert await holding(app_conn, "k") == 2
        else:
            await held.rollback()
            await racing
            assert await holding(app_conn, "k") == 2
    finally:
        await holder.close()
        await other.close()


async def test_batches_locking_keys_in_other_orders_never_deadlock(
    app_conn: asyncpg.Connection, db_url: str
) -> None:
    keys = [f"key:{n}" for n in range(6)]
    for key in keys:
        await put_limit(app_conn, key, 1000)
    conns = [await asyncpg.connect(db_url) for _ in range(2)]
    holder = await asyncpg.connect(db_url)
    try:
        for round_ in range(len(keys)):
            # One key held open, then two batches naming the keys in opposite orders start:
            # locked in item order, one would take a key the other waits behind.
            held = holder.transaction()
            await held.start()
            await holder.fetchval(SUBMIT, QUEUE, options(keys[round_]))
            forward = [conn.transaction() for conn in conns]
            for transaction in forward:
                await transaction.start()
            first = asyncio.create_task(conns[0].fetchval(SUBMIT_BATCH, batch(*keys)))
            second = asyncio.create_task(conns[1].fetchval(SUBMIT_BATCH, batch(*keys[::-1])))
            for conn in conns:
                pid = conn.get_server_pid()
                await until(
                    lambda pid=pid: waiting_for_a_lock(app_conn, pid)  # type: ignore[misc]
                )
            await held.commit()
            done, pending = await asyncio.wait({first, second}, return_when="FIRST_COMPLETED")
            # the one that got every lock holds them to its commit; the other waits behind it
            [winner] = done
            assert winner.exception() is None
            index = 0 if winner is first else 1
            await forward[index].commit()
            [loser] = pending
            await loser  # a deadlock would raise DeadlockDetectedError here
            await forward[1 - index].commit()
        assert await app_conn.fetchval("SELECT count(*) FROM evora.jobs") == len(keys) * 13
    finally:
        for conn in (*conns, holder):
            await conn.close()
