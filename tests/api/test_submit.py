"""POST /v1/jobs: creation, idempotent replay and conflict, and every way a body is refused."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg
import pytest

from evora.config import Settings
from evora.protocol.jobs import JobResponse
from tests.api.conftest import PRODUCER, ApiClient, MakeClient, job, problem


async def test_created_job_has_defaults(client: ApiClient) -> None:
    response = await client.post(
        "/v1/jobs", json=job(payload={"to": "a@example.com"}), headers=PRODUCER
    )
    assert response.status == 201
    assert "Idempotent-Replayed" not in response.headers
    body = await response.json()
    JobResponse.model_validate(body)
    assert body["queue"] == "emails"
    assert body["type"] == "email.send"
    assert body["payload"] == {"to": "a@example.com"}
    assert body["state"] == "PENDING"
    assert (body["priority"], body["attempt"], body["max_attempts"]) == (0, 0, 5)
    assert body["lease_seconds"] == 30
    assert body["cancel_requested"] is False
    assert body["created_at"].endswith("Z")
    assert datetime.fromisoformat(body["run_at"]) <= datetime.now(UTC)


async def test_identical_keyed_submission_replays_existing_job(client: ApiClient) -> None:
    body = job(idempotency_key="order-1", payload={"n": 1})
    first = await client.post("/v1/jobs", json=body, headers=PRODUCER)
    assert first.status == 201
    again = await client.post("/v1/jobs", json=body, headers=PRODUCER)
    assert again.status == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert (await again.json())["id"] == (await first.json())["id"]


async def test_same_key_in_another_queue_is_a_new_job(client: ApiClient) -> None:
    first = await client.post("/v1/jobs", json=job(idempotency_key="k"), headers=PRODUCER)
    other = await client.post(
        "/v1/jobs", json=job(queue="sms", idempotency_key="k"), headers=PRODUCER
    )
    assert (first.status, other.status) == (201, 201)


async def test_same_key_with_different_fields_is_a_conflict(client: ApiClient) -> None:
    await client.post("/v1/jobs", json=job(idempotency_key="k", priority=1), headers=PRODUCER)
    response = await client.post(
        "/v1/jobs", json=job(idempotency_key="k", priority=2), headers=PRODUCER
    )
    await problem(response, 409, "idempotency_conflict")


async def test_concurrent_identical_submissions_create_one_job(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    body = job(idempotency_key="race", payload={"x": 1})
    responses = await asyncio.gather(
        *(client.post("/v1/jobs", json=body, headers=PRODUCER) for _ in range(20))
    )
    statuses = sorted(r.status for r in responses)
    assert statuses == [200] * 19 + [201]
    ids = {(await r.json())["id"] for r in responses}
    assert len(ids) == 1
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 1


async def test_concurrent_submissions_each_get_their_own_outcome(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    """Concurrent single submissions share statements; a conflict in one must not fail or
    undo the others."""
    await client.post("/v1/jobs", json=job(idempotency_key="taken", priority=1), headers=PRODUCER)
    bodies = [job(payload={"n": n}) for n in range(20)]
    bodies += [job(idempotency_key="taken", priority=2)] * 5
    bodies += [job(idempotency_key="fresh", priority=3)] * 5
    responses = await asyncio.gather(
        *(client.post("/v1/jobs", json=body, headers=PRODUCER) for body in bodies)
    )
    plain, conflicting, fresh = responses[:20], responses[20:25], responses[25:]
    assert [r.status for r in plain] == [201] * 20
    for response in conflicting:
        await problem(response, 409, "idempotency_conflict")
    assert sorted(r.status for r in fresh) == [200] * 4 + [201]
    assert len({(await r.json())["id"] for r in fresh}) == 1
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 1 + 20 + 1


async def test_malformed_json_is_400(shared_client: ApiClient) -> None:
    response = await shared_client.post("/v1/jobs", data=b'{"queue": "q",', headers=PRODUCER)
    await problem(response, 400, "malformed_json")


async def test_invalid_fields_are_422_with_locations(shared_client: ApiClient) -> None:
    response = await shared_client.post(
        "/v1/jobs",
        json={"queue": "bad queue", "priority": 40000, "surprise": 1},
        headers=PRODUCER,
    )
    body = await problem(response, 422, "validation_error")
    locs = {tuple(e["loc"]) for e in body["errors"]}
    assert {("queue",), ("type",), ("priority",), ("surprise",)} <= locs
    assert all(isinstance(e["msg"], str) for e in body["errors"])


async def test_run_at_and_delay_together_are_422(shared_client: ApiClient) -> None:
    response = await shared_client.post(
        "/v1/jobs",
        json=job(run_at="2030-01-01T00:00:00Z", delay_seconds=5),
        headers=PRODUCER,
    )
    await problem(response, 422, "validation_error")


async def test_a_body_that_is_not_an_object_is_422(shared_client: ApiClient) -> None:
    response = await shared_client.post("/v1/jobs", json=[1, 2], headers=PRODUCER)
    await problem(response, 422, "validation_error")


async def test_oversized_payload_is_413(make_client: MakeClient, settings: Settings) -> None:
    client = await make_client(settings.model_copy(update={"max_payload_bytes": 100}))
    fits = await client.post("/v1/jobs", json=job(payload="x" * 98), headers=PRODUCER)
    assert fits.status == 201  # 98 characters plus two quotes: exactly the limit
    response = await client.post("/v1/jobs", json=job(payload="x" * 99), headers=PRODUCER)
    body = await problem(response, 413, "payload_too_large")
    assert "payload" in body["detail"]


async def test_oversized_body_is_413(make_client: MakeClient, settings: Settings) -> None:
    client = await make_client(settings.model_copy(update={"max_payload_bytes": 100}))
    # Whitespace does not count towards the payload, but the body as sent is still bounded.
    padded = b'{"queue": "q", "type": "t", "payload": {}' + b" " * 70_000 + b"}"
    response = await client.post("/v1/jobs", data=padded, headers=PRODUCER)
    await problem(response, 413, "payload_too_large")


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        # JSON allows these, PostgreSQL cannot store them. (An integer beyond 64 bits is
        # stored exactly: tests/api/test_exact_numbers.py.)
        (b'{"payload": {"text": "a\\u0000b"}}', ["payload"]),
        (b'{"payload": {"\\u0000": 1}}', ["payload"]),
        (b'{"idempotency_key": "\\u0000"}', ["idempotency_key"]),
        (b'{"group_key": "g\\u0000"}', ["group_key"]),
        # Valid RFC 3339, but past year 1 or 9999 once converted to UTC.
        (b'{"run_at": "0001-01-01T00:00:00+01:00"}', ["run_at"]),
        (b'{"expires_at": "9999-12-31T23:59:59-01:00"}', ["expires_at"]),
        # ... or once rounded to microseconds as PostgreSQL rounds it
        (b'{"run_at": "9999-12-31T23:59:59.9999995Z"}', ["run_at"]),
    ],
)
async def test_values_postgresql_cannot_store_are_422(
    shared_client: ApiClient, body: bytes, loc: list[str]
) -> None:
    data = b'{"queue": "q", "type": "t", ' + body[1:]
    response = await shared_client.post("/v1/jobs", data=data, headers=PRODUCER)
    problem_body = await problem(response, 422, "validation_error")
    assert [e["loc"] for e in problem_body["errors"]] == [loc]


async def test_edge_values_that_can_be_stored_round_trip(shared_client: ApiClient) -> None:
    payload = {"escaped": "\\u0000", "big": 2**63 - 1, "small": -(2**63), "uni": "\u2028\U0001f600"}
    response = await shared_client.post(
        "/v1/jobs",
        json=job(payload=payload, run_at="9999-12-31T23:59:59Z", idempotency_key="\U0001f600"),
        headers=PRODUCER,
    )
    assert response.status == 201, await response.text()
    body = await response.json()
    assert body["payload"] == payload
    assert body["run_at"] == "9999-12-31T23:59:59Z"
