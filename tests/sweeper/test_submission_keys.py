"""Retention of debounce and throttle keys (docs/flow-control.md, "Debounce and throttle"):
the sweeper forgets a throttle key once its window has passed and a debounce key once its
job can absorb nothing more (started, finished or gone), in batches; a key a submission is
writing at that moment, in a transaction still open or one that commits while the pass
runs, keeps the row that submission wrote."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from typing import Any
from uuid import UUID

import asyncpg
import orjson

from evora.protocol.jobs import Debounce, JobSubmission, Throttle
from evora.storage.jobs import Completion, Failure, JobStore
from evora.storage.retention import RetentionStore
from tests.conftest import Clock
from tests.polling import until
from tests.sweeper.conftest import FAST, StartSweeper, done_or_waiting

Q = "keys"
# throttled jobs wait in a queue of their own: the claims below take only debounced ones
QT = "throttled"
BATCH = 4
DEBOUNCE_SQL = {"delay_seconds": 3600, "max_delay_seconds": 86_400}


def debounced(key: str, delay: float = 0, **fields: Any) -> JobSubmission:
    return JobSubmission(
        queue=Q,
        type="t",
        payload={"key": key},
        debounce=Debounce(key=key, delay_seconds=delay, max_delay_seconds=86_400),
        **fields,
    )


def throttled(key: str, window: float) -> JobSubmission:
    return JobSubmission(queue=QT, type="t", throttle=Throttle(key=key, window_seconds=window))


async def keys(pool: asyncpg.Pool) -> dict[tuple[str, str], UUID]:
    rows = await pool.fetch("SELECT kind, key, job_id FROM evora.submission_keys")
    return {(r["kind"], r["key"]): r["job_id"] for r in rows}


async def in_sql(conn: asyncpg.Connection, key: str, queue: str = Q, **options: Any) -> UUID:
    job_id: UUID = await conn.fetchval(
        "SELECT evora.submit($1, 't', $2::jsonb, $3::jsonb)",
        queue,
        orjson.dumps({"key": key}).decode(),
        orjson.dumps(options).decode(),
    )
    return job_id


async def test_keys_that_answer_no_later_submission_are_pruned(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    # throttle keys: nine with a window of a second, two of an hour
    for n in range(9):
        assert (await store.submit(throttled(f"brief:{n}", 1))).created
    for n in range(2):
        assert (await store.submit(throttled(f"hour:{n}", 3600))).created
    # debounce keys whose job can no longer absorb: running, retried (PENDING again, but
    # started), completed, cancelled; and one whose job is gone
    for key in ("running", "retried", "completed"):
        await store.submit(debounced(key))
    jobs = await store.claim(worker_id="w", queues=[Q], max_jobs=3)
    claimed = {j["payload"]["key"]: j for j in jobs}
    await store.fail(Failure(claimed["retried"]["id"], claimed["retried"]["lease_token"], "again"))
    await store.complete(claimed["completed"]["id"], claimed["completed"]["lease_token"])
    await store.cancel((await store.submit(debounced("cancelled", delay=3600))).id)
    await pool.execute(
        "INSERT INTO evora.submission_keys (queue, kind, key, job_id, since, run_by)"
        " VALUES ($1, 'debounce', 'gone', gen_random_uuid(), now(), now() + interval '1 h')",
        Q,
    )
    # and two whose job is still PENDING and never started: they absorb the next one
    waiting = {key: (await store.submit(debounced(key, delay=3600))).id for key in ("a", "b")}
    await clock.advance(2)
    kept = {("throttle", f"hour:{n}") for n in range(2)} | {("debounce", k) for k in waiting}
    assert len(await keys(pool)) == 9 + 5 + len(kept)

    sweeper = await start_sweeper(replace(FAST, prune_batch=BATCH))

    async def only_kept_left() -> bool:
        return set(await keys(pool)) == kept

    await until(only_kept_left, "the keys that answer nothing to be pruned")
    await until(
        lambda: sweeper.metric("evora_sweeper_pruned_total", kind="submission_keys") == 14,
        "the pruned keys to be counted",
    )
    # What stays answers as before; a forgotten key makes a new job, as after its window.
    for key, job_id in waiting.items():
        again = await store.submit(debounced(key, delay=3600))
        assert (again.id, again.answered_by_key) == (job_id, "debounced")
    assert (await store.submit(throttled("hour:0", 3600))).answered_by_key == "throttled"
    assert (await store.submit(throttled("brief:0", 1))).created
    assert (await store.submit(debounced("running"))).created


async def test_a_submission_holding_its_key_keeps_the_row_it_writes(
    store: JobStore, pool: asyncpg.Pool, db_url: str, clock: Clock
) -> None:
    # A debounce key whose job started and a throttle key past its window: both prunable...
    first = await store.submit(debounced("doc"))
    [started] = await store.claim(worker_id="w", queues=[Q])
    assert started["id"] == first.id
    throttle_first = await store.submit(throttled("t", 1))
    await clock.advance(100)
    holder = await asyncpg.connect(db_url)
    try:
        held = holder.transaction()
        await held.start()
        # ... when an application submits with both keys in a transaction it keeps open: it
        # made a new job for each and wrote the keys' rows, not committed yet.
        made = await in_sql(holder, "doc", debounce=DEBOUNCE_SQL | {"key": "doc"})
        throttle_made = await in_sql(holder, "t", QT, throttle={"key": "t", "window_seconds": 50})
        pruning = asyncio.create_task(RetentionStore(pool).prune_submission_keys(1000))

        # The pass either passes over the rows being written or waits for their writer: the
        # holder commits at that moment, the unlucky one.
        await until(
            lambda: done_or_waiting(pool, pruning), "the pass to finish or wait for the held rows"
        )
        await held.commit()
        await pruning
    finally:
        await holder.close()
    assert await keys(pool) == {("debounce", "doc"): made, ("throttle", "t"): throttle_made}
    # So the next submissions are answered by the application's jobs, not made twice.
    again = await store.submit(debounced("doc", delay=3600))
    assert (again.id, again.answered_by_key) == (made, "debounced")
    assert (await store.submit(throttled("t", 50))).id == throttle_made != throttle_first.id


async def test_concurrent_producers_claims_and_prunes_keep_one_absorbing_job_per_key(
    store: JobStore, pool: asyncpg.Pool, db_url: str
) -> None:
    """A natural race, autocommit statements only: producers submit on four debounce keys
    while a worker claims and completes their jobs and the pruner runs. A row pruned while
    it named a job still PENDING and never started would let the next submission make a
    second such job beside it."""
    names = [f"k{n}" for n in range(4)]
    conns = [await asyncpg.connect(db_url) for _ in range(4)]
    retention = RetentionStore(pool)
    producing = True
    pruned = 0
    try:

        async def produce(conn: asyncpg.Connection, seed: int) -> None:
            rnd = random.Random(seed)
            for _ in range(60):
                key = rnd.choice(names)
                await in_sql(conn, key, debounce=DEBOUNCE_SQL | {"key": key, "delay_seconds": 0})

        async def work() -> None:
            while producing:
                claimed = await store.claim(worker_id="w", queues=[Q], max_jobs=2)
                await store.complete_many([Completion(j["id"], j["lease_token"]) for j in claimed])

        async def prune() -> None:
            nonlocal pruned
            while producing:
                pruned += await retention.prune_submission_keys(BATCH)

        others = [asyncio.create_task(work()), asyncio.create_task(prune())]
        try:
            await asyncio.gather(*(produce(conn, n) for n, conn in enumerate(conns)))
        finally:
            producing = False
            await asyncio.gather(*others)
    finally:
        for conn in conns:
            await conn.close()
    assert pruned > 0
    absorbing = await pool.fetch(
        "SELECT payload->>'key' AS key, array_agg(id) AS ids FROM evora.jobs"
        " WHERE state = 'PENDING' AND started_at IS NULL GROUP BY 1"
    )
    rows = await keys(pool)
    for r in absorbing:
        assert len(r["ids"]) == 1, r
        assert rows[("debounce", r["key"])] == r["ids"][0]
