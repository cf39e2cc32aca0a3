"""`evora api` killed with SIGKILL three times while producers submit keyed batches, one of
them repeating another's batches word for word, and started again on the same port. Each
producer repeats a batch whose answer it did not get, as the SDK documents for keyed
submissions. Exactly-once admission must hold through it: every key is one job, the one every
answer for it named, and a batch cut short by the kill left nothing half-stored."""

from __future__ import annotations

import asyncio
import functools
import signal

import aiohttp
import asyncpg

from evora import Client, Submission
from evora.sdk.errors import EvoraClientError
from tests.e2e.conftest import Child, Children, free_port, spawn_service
from tests.polling import until
from tests.servers import PRODUCER_TOKEN

QUEUE = "api-crash"
BATCHES = 24
BATCH_SIZE = 50
KILLS = 3


def _batch(producer: int, number: int) -> list[Submission]:
    return [
        {
            "queue": QUEUE,
            "type": "t",
            "payload": {"batch": number, "item": i},
            "idempotency_key": f"p{producer}-b{number}-i{i}",
        }
        for i in range(BATCH_SIZE)
    ]


def _at_least(done: list[int], count: int) -> bool:
    return len(done) >= count


async def test_api_killed_mid_batches_admits_each_job_exactly_once(
    db_url: str, children: Children, pool: asyncpg.Pool
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    answers: dict[str, set[str]] = {}  # key -> every id an answer named for it
    done: list[int] = []  # batches answered, over all producers
    failures: list[int] = []  # attempts that got no answer

    async def produce(batches: list[list[Submission]]) -> None:
        async with Client(url, PRODUCER_TOKEN, retries=0) as client:
            for jobs in batches:
                while True:  # repeated, with the same keys, until answered
                    try:
                        receipts = await client.submit_batch(jobs, return_jobs=False)
                    except EvoraClientError:
                        failures.append(1)
                        await asyncio.sleep(0.02)
                        continue
                    for job, receipt in zip(jobs, receipts, strict=True):
                        answers.setdefault(job["idempotency_key"], set()).add(receipt.id)
                    done.append(1)
                    break

    own = [[_batch(p, b) for b in range(BATCHES)] for p in range(2)]
    async with aiohttp.ClientSession() as http:
        api: Child = await spawn_service(children, http, db_url, "api", port)

        async def kill_and_restart() -> None:
            nonlocal api
            for kill in range(1, KILLS + 1):
                due = kill * BATCHES * 3 // (KILLS + 1)  # batches answered before this kill
                await until(functools.partial(_at_least, done, due), "batches", within=60)
                api.send(signal.SIGKILL)
                await api.wait(10)
                api = await spawn_service(children, http, db_url, "api", port)

        # The third producer sends the first one's batches again, in the same order: racing
        # duplicates of the same keys with the same fields.
        await asyncio.gather(kill_and_restart(), produce(own[0]), produce(own[1]), produce(own[0]))
        assert api.running
    assert len(failures) >= KILLS  # the kills cut requests off

    rows = await pool.fetch(
        "SELECT idempotency_key, id::text FROM evora.jobs WHERE queue = $1", QUEUE
    )
    stored = {row["idempotency_key"]: row["id"] for row in rows}
    assert len(rows) == len(stored) == 2 * BATCHES * BATCH_SIZE
    # Every answer for a key named the one job stored for it.
    assert {key: {stored[key]} for key in answers} == answers
    assert set(answers) == set(stored)
    # Each batch was stored by one transaction: its jobs' `submitted` events share one xid.
    split = await pool.fetch(
        """
        SELECT split_part(j.idempotency_key, '-i', 1) AS batch, count(DISTINCT e.xid) AS xids
        FROM evora.jobs j JOIN evora.job_events e ON e.job_id = j.id AND e.event = 'submitted'
        WHERE j.queue = $1
        GROUP BY 1 HAVING count(DISTINCT e.xid) > 1
        """,
        QUEUE,
    )
    assert [dict(row) for row in split] == []
