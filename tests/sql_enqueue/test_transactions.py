"""evora.submit inside the application's transaction: a rollback leaves no job, no event and
no wake-up; a commit makes the job, its `submitted` event and a NOTIFY hint that wakes a
waiting long-poll of the real dispatcher as an HTTP submission does."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from evora_services.dispatcher.state import DISPATCH
from tests.polling import until
from tests.servers import Service
from tests.sql_enqueue.conftest import PRODUCER, WORKER

ROUNDS = 5
# A claim is woken by the hint in milliseconds; without one the dispatcher's fallback poll
# finds the job within 2 s. The bound only keeps a lost wake-up from hanging the test.
WAKE_BOUND_S = 10.0


class Hints:
    """The `evora_jobs` notifications a listening connection received, in order."""

    def __init__(self) -> None:
        self.queues: list[str] = []

    def __call__(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        self.queues.append(payload)


async def _listening(db_url: str) -> tuple[asyncpg.Connection, Hints]:
    conn = await asyncpg.connect(db_url)
    hints = Hints()
    await conn.add_listener("evora_jobs", hints)
    return conn, hints


async def test_a_rollback_leaves_no_job_no_event_and_no_hint(
    db_url: str, app_conn: asyncpg.Connection
) -> None:
    listener, hints = await _listening(db_url)
    try:
        await app_conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        tx = app_conn.transaction()
        await tx.start()
        await app_conn.execute("INSERT INTO orders VALUES (1)")
        job_id = await app_conn.fetchval("SELECT evora.submit('rolled', 'order.ship')")
        batch = await app_conn.fetchval(
            """SELECT evora.submit_batch('[{"queue": "rolled", "type": "t"}]')"""
        )
        # inside the transaction the job exists, with its event
        assert await app_conn.fetchval("SELECT count(*) FROM evora.jobs") == 2
        assert await app_conn.fetchval("SELECT count(*) FROM evora.job_events") == 2
        await tx.rollback()
        assert await app_conn.fetchval("SELECT count(*) FROM orders") == 0
        assert await app_conn.fetchval("SELECT count(*) FROM evora.jobs") == 0
        assert await app_conn.fetchval("SELECT count(*) FROM evora.job_events") == 0
        assert await app_conn.fetchval("SELECT count(*) FROM evora.idempotency_keys") == 0
        # Hints arrive in commit order: once a later commit's hint is here, a hint of the
        # rolled-back transaction would have been seen before it.
        await app_conn.fetchval("SELECT evora.submit('committed', 'order.ship')")
        await until(lambda: "committed" in hints.queues, "the committed job's hint")
        assert hints.queues == ["committed"]
        assert job_id not in batch
    finally:
        await listener.close()


async def test_a_commit_stores_the_job_and_its_event_and_hints_its_queue(
    db_url: str, app_conn: asyncpg.Connection
) -> None:
    listener, hints = await _listening(db_url)
    try:
        async with app_conn.transaction():
            job_id = await app_conn.fetchval(
                """SELECT evora.submit('mail', 'mail.send', '{"to": "a@example.com"}',
                                       '{"priority": 3, "group_key": "acct-1"}')"""
            )
        job = await app_conn.fetchrow("SELECT * FROM evora.jobs WHERE id = $1", job_id)
        assert (job["state"], job["priority"], job["group_key"]) == ("PENDING", 3, "acct-1")
        events = await app_conn.fetch("SELECT * FROM evora.job_events WHERE job_id = $1", job_id)
        assert [(e["event"], e["from_state"], e["to_state"]) for e in events] == [
            ("submitted", None, "PENDING")
        ]
        assert events[0]["job_version"] == job["version"]
        await until(lambda: hints.queues == ["mail"], "the hint for the committed job")
    finally:
        await listener.close()


async def _notify_wakeups(http: aiohttp.ClientSession, dispatcher: Service) -> float:
    async with http.get(dispatcher.url + "/metrics") as response:
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "evora_dispatcher_wakeups_total"
                and sample.labels["cause"] == "notify"
            ):
                return sample.value
    return 0.0


async def _woken_within(
    http: aiohttp.ClientSession,
    dispatcher: Service,
    queue: str,
    submit: Callable[[], Awaitable[uuid.UUID]],
) -> float:
    """Seconds from a submission's commit to the claim of a waiting long-poll returning it."""
    body = {"worker_id": "w-1", "queues": [queue], "max_jobs": 1, "wait_seconds": 30}
    claim = asyncio.create_task(http.post(dispatcher.url + "/v1/claim", json=body, headers=WORKER))
    await until(
        lambda: dispatcher.app[DISPATCH].wakeups.waiting().get(queue, 0) == 1,
        "the long-poll waiting in the dispatcher",
    )
    started = time.monotonic()
    job_id = await submit()
    async with await asyncio.wait_for(claim, WAKE_BOUND_S) as response:
        elapsed = time.monotonic() - started
        assert response.status == 200
        assert [j["id"] for j in (await response.json())["jobs"]] == [str(job_id)]
    return elapsed


async def test_a_committed_job_wakes_a_waiting_worker_as_an_http_one_does(
    app_conn: asyncpg.Connection, api: Service, dispatcher: Service
) -> None:
    async with aiohttp.ClientSession() as http:

        async def in_sql() -> uuid.UUID:
            async with app_conn.transaction():
                await app_conn.execute("SELECT 1")  # the application's own work
                job_id: uuid.UUID = await app_conn.fetchval("SELECT evora.submit('wake', 't')")
            return job_id

        async def over_http() -> uuid.UUID:
            job = {"queue": "wake", "type": "t"}
            async with http.post(api.url + "/v1/jobs", json=job, headers=PRODUCER) as response:
                assert response.status == 201
                return uuid.UUID((await response.json())["id"])

        latencies: dict[str, list[float]] = {"sql": [], "http": []}
        by_hint = {"sql": 0, "http": 0}
        for _ in range(ROUNDS):
            for way, submit in (("sql", in_sql), ("http", over_http)):
                before = await _notify_wakeups(http, dispatcher)
                latencies[way].append(await _woken_within(http, dispatcher, "wake", submit))
                by_hint[way] += int(await _notify_wakeups(http, dispatcher) - before)
    # Woken by the hint, not by the fallback poll (which wakes every waiter each 2 s, so it
    # may, rarely, come between a commit and its hint and claim the job first).
    assert by_hint["sql"] >= ROUNDS - 1, by_hint
    assert by_hint["http"] >= ROUNDS - 1, by_hint
    for way, seconds in latencies.items():
        ms = sorted(s * 1000 for s in seconds)
        print(f"wake latency {way}: median {ms[len(ms) // 2]:.1f} ms, max {ms[-1]:.1f} ms")
