"""Long-poll wake-ups: NOTIFY, timers, no thundering herd, disconnects, shutdown, LISTEN
reconnects. Waiting is observed through the dispatcher's own state, never by sleeping."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import JobStore
from tests.dispatcher.conftest import WORKER, Dispatcher
from tests.polling import until


def long_poll(
    d: Dispatcher, queues: list[str], wait: float = 20, **fields: Any
) -> asyncio.Task[tuple[int, Any]]:
    body = {
        "worker_id": fields.pop("worker_id", "w"),
        "queues": queues,
        "wait_seconds": wait,
        **fields,
    }
    return asyncio.create_task(d.post("/v1/claim", body))


def waiting(d: Dispatcher, queue: str) -> int:
    return d.state.wakeups.waiting().get(queue, 0)


async def test_submission_wakes_a_waiting_poll_by_notify(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    empty_claims = dispatcher.empty_claims()
    poll = long_poll(dispatcher, ["mail"], wait=30)
    await dispatcher.poll_waiting("mail", empty_claims)
    assert dispatcher.metric("evora_dispatcher_waiting_polls", queue="mail") == 1
    started = time.monotonic()
    job = (await store.submit(JobSubmission(queue="mail", type="t"))).job
    status, answer = await asyncio.wait_for(poll, 10)
    elapsed = time.monotonic() - started
    assert status == 200 and [j["id"] for j in answer["jobs"]] == [str(job["id"])]
    assert dispatcher.metric("evora_dispatcher_wakeups_total", cause="notify") >= 1
    assert elapsed < 30  # answered long before the wait ran out
    assert waiting(dispatcher, "mail") == 0
    assert dispatcher.metric("evora_dispatcher_waiting_polls", queue="mail") == 0


async def test_delayed_job_is_handed_out_when_due(dispatcher: Dispatcher, store: JobStore) -> None:
    # The poll waits before the job exists, and the job is due well after the claim its
    # submission's hint wakes: a claim that came after the job was due would take it without
    # any timer (under load, a delay of 0.5 s was passed both by a poll's first claim and by
    # the hint's).
    poll = long_poll(dispatcher, ["later"], wait=20)
    await until(lambda: waiting(dispatcher, "later") == 1)
    job = (await store.submit(JobSubmission(queue="later", type="t", delay_seconds=2))).job
    status, answer = await asyncio.wait_for(poll, 15)
    assert status == 200 and answer["jobs"][0]["id"] == str(job["id"])
    assert dispatcher.metric("evora_dispatcher_wakeups_total", cause="timer") >= 1


async def test_one_job_wakes_one_waiter_not_all(dispatcher: Dispatcher, store: JobStore) -> None:
    polls = [long_poll(dispatcher, ["herd"], wait=3, worker_id=f"w{i}") for i in range(20)]
    # every poll registers, makes its first claim (empty, or skipped as known drained), then
    # waits
    await until(
        lambda: (
            dispatcher.metric("evora_dispatcher_claims_total", result="empty")
            + dispatcher.metric("evora_dispatcher_claims_total", result="skipped")
            >= 20
        )
    )
    claims_before = dispatcher.metric("evora_dispatcher_claims_total", result="empty")
    await store.submit(JobSubmission(queue="herd", type="t"))
    await until(lambda: dispatcher.metric("evora_dispatcher_claims_total", result="jobs") == 1)
    results = await asyncio.gather(*polls)
    got = [answer["jobs"] for _, answer in results if answer["jobs"]]
    assert len(got) == 1
    wasted = dispatcher.metric("evora_dispatcher_claims_total", result="empty") - claims_before
    # a fallback poll may cost a few empty claims, but nowhere near one per waiter
    assert wasted < 10


async def test_a_poll_skips_its_claim_while_nothing_announced_a_job(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    await until(lambda: dispatcher.metric("evora_dispatcher_listener_connected") == 1)
    status, answer = await long_poll(dispatcher, ["calm"], wait=0)
    assert (status, answer["jobs"]) == (200, [])
    assert dispatcher.metric("evora_dispatcher_claims_total", result="skipped") == 0
    # the last claim came back short and no hint came since: no query
    status, answer = await long_poll(dispatcher, ["calm"], wait=0)
    assert (status, answer["jobs"]) == (200, [])
    assert dispatcher.metric("evora_dispatcher_claims_total", result="skipped") == 1
    # a hint with nobody waiting still counts: the next poll claims at once
    job = (await store.submit(JobSubmission(queue="calm", type="t"))).job
    await until(lambda: dispatcher.state.wakeups.hints(["calm"]) == 1)
    status, answer = await long_poll(dispatcher, ["calm"], wait=0)
    assert [j["id"] for j in answer["jobs"]] == [str(job["id"])]
    assert dispatcher.metric("evora_dispatcher_claims_total", result="skipped") == 1
    # other types are another claim shape, known nothing about
    status, answer = await long_poll(dispatcher, ["calm"], wait=0, types=["other"])
    assert dispatcher.metric("evora_dispatcher_claims_total", result="skipped") == 1


async def test_full_batch_passes_the_wakeup_on(dispatcher: Dispatcher, store: JobStore) -> None:
    polls = [
        long_poll(dispatcher, ["many"], wait=20, max_jobs=2, worker_id=f"w{i}") for i in range(3)
    ]
    await until(lambda: waiting(dispatcher, "many") == 3)
    await store.submit_batch([JobSubmission(queue="many", type="t") for _ in range(6)])
    results = await asyncio.wait_for(asyncio.gather(*polls), 15)
    claimed = [j["id"] for _, answer in results for j in answer["jobs"]]
    assert len(claimed) == len(set(claimed)) == 6


async def test_disconnected_poll_strands_nothing(
    dispatcher: Dispatcher, store: JobStore, pool: asyncpg.Pool
) -> None:
    session = aiohttp.ClientSession()
    body = {"worker_id": "gone", "queues": ["drop"], "wait_seconds": 30}
    request = asyncio.create_task(
        session.post(dispatcher.url + "/v1/claim", json=body, headers=WORKER)
    )
    await until(lambda: waiting(dispatcher, "drop") == 1)
    request.cancel()
    await session.close()
    await until(lambda: waiting(dispatcher, "drop") == 0)
    job = (await store.submit(JobSubmission(queue="drop", type="t"))).job
    _, answer = await asyncio.wait_for(
        long_poll(dispatcher, ["drop"], wait=10, worker_id="alive"), 15
    )
    assert [j["id"] for j in answer["jobs"]] == [str(job["id"])]
    assert answer["jobs"][0]["attempt"] == 1
    claimers = await pool.fetch("SELECT worker_id FROM evora.job_events WHERE event = 'claimed'")
    assert [r["worker_id"] for r in claimers] == ["alive"]


async def test_shutdown_answers_waiting_polls_at_once(db_url: str) -> None:
    from aiohttp.test_utils import TestServer

    from evora.config import Settings
    from evora_services.dispatcher.app import create_app
    from evora_services.dispatcher.state import DISPATCH

    app = await create_app(Settings(database_url=db_url, tokens="worker:test-worker-token"))
    server = TestServer(app, host="127.0.0.1", handler_cancellation=True)
    await server.start_server()
    async with aiohttp.ClientSession() as http:
        body = {"worker_id": "w", "queues": ["q"], "wait_seconds": 60}
        poll = asyncio.create_task(
            http.post(server.make_url("/v1/claim"), json=body, headers=WORKER)
        )
        await until(lambda: app[DISPATCH].wakeups.waiting().get("q") == 1)
        started = time.monotonic()
        closing = asyncio.create_task(server.close())
        response = await asyncio.wait_for(poll, 10)
        assert response.status == 200 and (await response.json())["jobs"] == []
        await closing
    assert time.monotonic() - started < 10


async def test_listener_reconnects_and_catches_up(
    dispatcher: Dispatcher, store: JobStore, pool: asyncpg.Pool
) -> None:
    await until(lambda: dispatcher.metric("evora_dispatcher_listener_connected") == 1)
    killed = await pool.fetchval(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = 'evora-dispatcher-listen'"
    )
    assert killed == 1
    await until(lambda: dispatcher.metric("evora_dispatcher_listener_connected") == 0)
    await until(lambda: dispatcher.metric("evora_dispatcher_listener_connected") == 1)
    empty_claims = dispatcher.empty_claims()
    poll = long_poll(dispatcher, ["after"], wait=30)
    await dispatcher.poll_waiting("after", empty_claims)
    notified = dispatcher.metric("evora_dispatcher_wakeups_total", cause="notify")
    await store.submit(JobSubmission(queue="after", type="t"))
    _, answer = await asyncio.wait_for(poll, 10)
    assert len(answer["jobs"]) == 1
    assert dispatcher.metric("evora_dispatcher_wakeups_total", cause="notify") > notified
