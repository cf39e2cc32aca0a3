"""`evora.Client` against the real api service (failures only a fake server can stage are
in test_client_faults.py)."""

from __future__ import annotations

import pytest

import evora
from evora import Client
from evora.protocol.states import JobState
from tests.servers import PRODUCER_TOKEN, Services


async def test_submit_then_get(client: Client) -> None:
    submitted = await client.submit("emails", "email.send", {"to": "a@b.c"}, priority=-3)
    assert not submitted.replayed
    job = await client.get(submitted.id)
    assert job["state"] == "PENDING" and job["payload"] == {"to": "a@b.c"}
    assert (job["queue"], job["type"], job["priority"]) == ("emails", "email.send", -3)


async def test_payload_is_omitted_unless_given(client: Client) -> None:
    # Left out, the server's default (an empty object) applies; given as None, it is null.
    omitted = await client.submit("q", "t")
    null = await client.submit("q", "t", None)
    assert (await client.get(omitted.id))["payload"] == {}
    assert (await client.get(null.id))["payload"] is None


async def test_idempotent_replay_and_conflict(client: Client) -> None:
    first = await client.submit("q", "t", {"n": 1}, idempotency_key="k")
    again = await client.submit("q", "t", {"n": 1}, idempotency_key="k")
    assert (first.replayed, again.replayed) == (False, True)
    assert again.id == first.id
    with pytest.raises(evora.IdempotencyConflictError) as caught:
        await client.submit("q", "t", {"n": 2}, idempotency_key="k")
    assert (caught.value.status, caught.value.code) == (409, "idempotency_conflict")


async def test_submit_batch_without_jobs_answers_receipts(client: Client) -> None:
    batch: list[evora.Submission] = [
        {"queue": "q", "type": "t", "idempotency_key": "k"},
        {"queue": "q", "type": "t", "idempotency_key": "k"},
        {"queue": "q", "type": "t", "payload": {"n": 2}},
    ]
    receipts = await client.submit_batch(batch, return_jobs=False)
    assert [type(r) for r in receipts] == [evora.SubmitReceipt] * 3
    assert [r.replayed for r in receipts] == [False, True, False]
    assert receipts[0].id == receipts[1].id != receipts[2].id
    assert (await client.get(receipts[2].id))["payload"] == {"n": 2}
    # The same batch again with whole jobs: every key replays, the same ids come back.
    results = await client.submit_batch(batch[:2])
    assert [(r.id, r.replayed) for r in results] == [(receipts[0].id, True)] * 2
    assert results[0].job["state"] == "PENDING"


async def test_typed_errors_carry_the_problem(client: Client) -> None:
    with pytest.raises(evora.JobNotFoundError) as caught:
        await client.get("00000000-0000-4000-8000-000000000000")
    error = caught.value
    assert (error.status, error.code) == (404, "job_not_found") and error.detail
    assert error.title and error.type == "urn:evora:problem:job_not_found"

    with pytest.raises(evora.RequestValidationError) as invalid:
        await client.submit_batch([{"queue": "q", "type": "t"}, {"queue": "q"}])  # type: ignore[typeddict-item]
    assert invalid.value.errors == [
        {"loc": ["jobs", 1, "type"], "msg": "Field required", "type": "missing"}
    ]

    with pytest.raises(evora.QueueNotFoundError):
        await client.stats("never-seen")


async def test_cancel_then_cancel_again_is_invalid_state(client: Client) -> None:
    job_id = (await client.submit("q", "t")).id
    assert (await client.cancel(job_id))["state"] == "CANCELLED"
    with pytest.raises(evora.InvalidStateError) as caught:
        await client.cancel(job_id)
    assert caught.value.attempts == 1


async def test_authentication_and_roles(services: Services) -> None:
    async with Client(services.api.url, "wrong", retries=0) as stranger:
        with pytest.raises(evora.UnauthorizedError) as caught:
            await stranger.get("00000000-0000-4000-8000-000000000000")
        assert (caught.value.status, caught.value.code) == (401, "unauthorized")
    async with Client(services.api.url, PRODUCER_TOKEN, retries=0) as producer:
        await producer.submit("q", "t")
        with pytest.raises(evora.ForbiddenError):
            await producer.list_jobs()


async def test_list_pages_and_iterate(client: Client) -> None:
    ids = [(await client.submit("q", "t", {"i": i})).id for i in range(5)]
    await client.submit("other", "t")
    page = await client.list_jobs(queue="q", limit=2)
    assert [j["id"] for j in page.jobs] == ids[::-1][:2] and page.next is not None
    assert [j["id"] async for j in client.iter_jobs(queue="q", page_size=2)] == ids[::-1]
    await client.cancel(ids[0])
    cancelled = await client.list_jobs(state=JobState.CANCELLED)
    assert [j["id"] for j in cancelled.jobs] == [ids[0]] and cancelled.next is None


async def test_events(client: Client) -> None:
    job_id = (await client.submit("q", "t")).id
    await client.cancel(job_id)
    assert [e["event"] for e in await client.events(job_id)] == ["submitted", "cancelled"]


async def test_limits(client: Client) -> None:
    made = await client.set_limit("tenant:*", concurrency=2, rate=(10, 60.0))
    assert (made["key"], made["concurrency"], made["rate"]) == (
        "tenant:*",
        2,
        {"limit": 10, "per_seconds": 60.0},
    )
    await client.set_limit("queue:emails", concurrency=5)
    assert [limit["key"] for limit in await client.limits()] == ["queue:emails", "tenant:*"]
    job = await client.submit("emails", "t", limit_keys=["tenant:9"])
    assert job.job["limit_keys"] == ["tenant:9"]
    usage = await client.limit("tenant:9")
    assert (usage["governed_by"], usage["running"], usage["tokens"]) == ("tenant:*", 0, 10)
    await client.delete_limit("tenant:*")
    with pytest.raises(evora.LimitNotFoundError):
        await client.limit("tenant:9")
    with pytest.raises(evora.LimitNotFoundError):
        await client.delete_limit("tenant:*")


async def test_fairness_weights_and_keys(client: Client) -> None:
    made = await client.set_fairness("gold:*", 4)
    assert (made["key"], made["weight"]) == ("gold:*", 4)
    job = await client.submit("fair", "t", fairness_key="gold:acme")
    assert job.job["fairness_key"] == "gold:acme"
    weight = await client.fairness("gold:acme")
    assert (weight["weight"], weight["set_by"], weight["queues"]) == (4, "gold:*", [])
    page = await client.fair_keys("fair", limit=10)
    assert page["queues"] == [{"queue": "fair", "keys": 0, "backlogged_keys": 0}]
    assert (page["keys"], page["next"]) == ([], None)  # no claim has folded its key yet
    await client.delete_fairness("gold:*")
    await client.delete_fairness("gold:*")  # answered alike whether or not it had one
    assert (await client.fairness("gold:acme"))["weight"] == 1


async def test_room_and_queue_full(client: Client) -> None:
    made = await client.set_limit("tenant:*", max_pending=2)
    assert (made["concurrency"], made["rate"], made["max_pending"]) == (None, None, 2)
    assert await client.room("tenant:1") == 2
    await client.submit("q", "t", limit_keys=["tenant:1"])
    assert await client.room("tenant:1") == 1
    with pytest.raises(evora.QueueFullError) as refused:
        await client.submit_batch(
            [{"queue": "q", "type": "t", "limit_keys": ["tenant:1"]} for _ in range(2)]
        )
    assert (refused.value.status, refused.value.attempts) == (429, 1)  # not retried
    assert await client.room("tenant:1") == 1
    await client.set_limit("queue:q", concurrency=5)
    assert await client.room("queue:q") is None  # no max_pending


async def test_debounce_and_throttle(client: Client) -> None:
    debounce: evora.DebounceSpec = {"key": "doc", "delay_seconds": 60, "max_delay_seconds": 600}
    first = await client.submit("q", "t", {"n": 1}, debounce=debounce)
    again = await client.submit("q", "t", {"n": 2}, debounce=debounce)
    assert (first.debounced, first.replayed) == (False, False)
    assert (again.id, again.debounced, again.replayed) == (first.id, True, False)
    assert again.job["payload"] == {"n": 2}
    throttle: evora.ThrottleSpec = {"key": "t", "window_seconds": 60}
    receipts = await client.submit_batch(
        [{"queue": "q", "type": "t", "throttle": throttle}] * 2, return_jobs=False
    )
    assert [(r.throttled, r.replayed) for r in receipts] == [(False, False), (True, False)]
    assert receipts[0].id == receipts[1].id
    [answer] = await client.submit_batch([{"queue": "q", "type": "t", "throttle": throttle}])
    assert (answer.id, answer.throttled) == (receipts[0].id, True)
