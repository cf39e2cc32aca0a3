"""`evora.Client` against a real HTTP server speaking the HTTP API (tests/sdk/fake.py)."""

from __future__ import annotations

import pytest

import evora
from evora import Client
from evora.protocol.states import JobState
from tests.sdk.conftest import FAST
from tests.sdk.fake import PRODUCER_TOKEN, FakeEvora

JOB_ROUTE = "/v1/jobs/{id}"


async def test_submit_then_get(client: Client, fake: FakeEvora) -> None:
    submitted = await client.submit("emails", "email.send", {"to": "a@b.c"}, priority=-3)
    assert not submitted.replayed
    job = await client.get(submitted.id)
    assert job["state"] == "PENDING" and job["payload"] == {"to": "a@b.c"}
    assert fake.seen("POST", "/v1/jobs")[0].body == {
        "queue": "emails",
        "type": "email.send",
        "payload": {"to": "a@b.c"},
        "priority": -3,
    }


async def test_payload_is_omitted_unless_given(client: Client, fake: FakeEvora) -> None:
    await client.submit("q", "t")
    await client.submit("q", "t", None)
    bodies = [r.body for r in fake.seen("POST", "/v1/jobs")]
    assert "payload" not in bodies[0] and bodies[1]["payload"] is None


async def test_idempotent_replay_and_conflict(client: Client) -> None:
    first = await client.submit("q", "t", {"n": 1}, idempotency_key="k")
    again = await client.submit("q", "t", {"n": 1}, idempotency_key="k")
    assert (first.replayed, again.replayed) == (False, True)
    assert again.id == first.id
    with pytest.raises(evora.IdempotencyConflictError) as caught:
        await client.submit("q", "t", {"n": 2}, idempotency_key="k")
    assert (caught.value.status, caught.value.code) == (409, "idempotency_conflict")


async def test_typed_errors_carry_the_problem(client: Client) -> None:
    with pytest.raises(evora.JobNotFoundError) as caught:
        await client.get("00000000-0000-4000-8000-000000000000")
    error = caught.value
    assert (error.status, error.code, error.detail) == (404, "job_not_found", "no job with that id")
    assert error.title and error.type.startswith("https://")

    with pytest.raises(evora.RequestValidationError) as invalid:
        await client.submit_batch([{"queue": "q", "type": "t"}, {"queue": "q"}])  # type: ignore[typeddict-item]
    assert invalid.value.errors == [{"loc": ["body", "type"], "msg": "Field required"}]

    with pytest.raises(evora.QueueNotFoundError):
        await client.stats("never-seen")


async def test_cancel_then_cancel_again_is_invalid_state(client: Client) -> None:
    job_id = (await client.submit("q", "t")).id
    assert (await client.cancel(job_id))["state"] == "CANCELLED"
    with pytest.raises(evora.InvalidStateError) as caught:
        await client.cancel(job_id)
    assert caught.value.attempts == 1


async def test_authentication_and_roles(fake: FakeEvora) -> None:
    async with Client(fake.url, "wrong", retries=0) as stranger:
        with pytest.raises(evora.UnauthorizedError) as caught:
            await stranger.get("00000000-0000-4000-8000-000000000000")
        assert (caught.value.status, caught.value.code) == (401, "unauthorized")
    async with Client(fake.url, PRODUCER_TOKEN, retries=0) as producer:
        await producer.submit("q", "t")
        with pytest.raises(evora.ForbiddenError):
            await producer.list_jobs()


async def test_reads_are_retried_on_503(client: Client, fake: FakeEvora) -> None:
    job_id = (await client.submit("q", "t")).id
    fake.fault("GET", JOB_ROUTE, 503)
    fake.fault("GET", JOB_ROUTE, 502)
    assert (await client.get(job_id))["id"] == job_id
    assert len(fake.seen("GET", JOB_ROUTE)) == 3


async def test_retries_are_bounded(client: Client, fake: FakeEvora) -> None:
    for _ in range(5):
        fake.fault("GET", JOB_ROUTE, 503)
    with pytest.raises(evora.ServerError) as caught:
        await client.get("00000000-0000-4000-8000-000000000000")
    assert (caught.value.status, caught.value.attempts) == (503, 3)  # retries=2
    assert len(fake.seen("GET", JOB_ROUTE)) == 3


async def test_4xx_and_500_are_not_retried(client: Client, fake: FakeEvora) -> None:
    fake.fault("GET", JOB_ROUTE, 500)
    with pytest.raises(evora.ServerError):
        await client.get("00000000-0000-4000-8000-000000000000")
    with pytest.raises(evora.JobNotFoundError):
        await client.get("00000000-0000-4000-8000-000000000000")
    assert len(fake.seen("GET", JOB_ROUTE)) == 2


async def test_submit_without_key_is_not_repeated(client: Client, fake: FakeEvora) -> None:
    fake.fault("POST", "/v1/jobs", 503, after=True)
    with pytest.raises(evora.ServerError):
        await client.submit("q", "t")
    assert len(fake.seen("POST", "/v1/jobs")) == 1
    assert len(fake.jobs) == 1  # the server did create it: repeating would have made two


async def test_submit_with_key_is_repeated_and_reports_the_replay(
    client: Client, fake: FakeEvora
) -> None:
    fake.fault("POST", "/v1/jobs", 503, after=True)
    result = await client.submit("q", "t", idempotency_key="once")
    assert result.replayed and len(fake.jobs) == 1
    assert len(fake.seen("POST", "/v1/jobs")) == 2


async def test_batch_is_repeated_only_when_every_item_has_a_key(
    client: Client, fake: FakeEvora
) -> None:
    fake.fault("POST", "/v1/jobs/batch", 503)
    with pytest.raises(evora.ServerError):
        await client.submit_batch(
            [{"queue": "q", "type": "t", "idempotency_key": "a"}, {"queue": "q", "type": "t"}]
        )
    fake.fault("POST", "/v1/jobs/batch", 503)
    results = await client.submit_batch(
        [
            {"queue": "q", "type": "t", "idempotency_key": "a"},
            {"queue": "q", "type": "t", "idempotency_key": "b", "payload": [1]},
        ]
    )
    assert [r.replayed for r in results] == [False, False]
    assert results[1].job["payload"] == [1]
    assert len(fake.seen("POST", "/v1/jobs/batch")) == 3


async def test_admin_retry_is_not_repeated(client: Client, fake: FakeEvora) -> None:
    fake.fault("POST", "/v1/jobs/{id}/retry", 503)
    with pytest.raises(evora.ServerError):
        await client.retry("00000000-0000-4000-8000-000000000000")
    assert len(fake.seen("POST", "/v1/jobs/{id}/retry")) == 1


async def test_a_repeated_cancel_that_finds_its_own_work_returns_the_job(
    client: Client, fake: FakeEvora
) -> None:
    job_id = (await client.submit("q", "t")).id
    fake.fault("POST", "/v1/jobs/{id}/cancel", 504, after=True)  # cancelled, answer lost
    job = await client.cancel(job_id)
    assert job["state"] == "CANCELLED"
    assert len(fake.seen("POST", "/v1/jobs/{id}/cancel")) == 2


async def test_connection_refused_is_retried_even_for_submit(fake: FakeEvora) -> None:
    url = fake.url
    await fake.stop()
    async with Client(url, PRODUCER_TOKEN, retries=2, retry_backoff=FAST) as client:
        with pytest.raises(evora.EvoraConnectionError) as caught:
            await client.submit("q", "t")
    assert caught.value.attempts == 3 and not caught.value.request_sent


async def test_timeouts_bound_every_call(fake: FakeEvora) -> None:
    fake.fault("GET", JOB_ROUTE, 200, delay=5)
    async with Client(fake.url, PRODUCER_TOKEN, timeout=0.2, retries=0) as client:
        with pytest.raises(evora.EvoraConnectionError) as caught:
            await client.get("00000000-0000-4000-8000-000000000000")
    assert caught.value.request_sent


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
