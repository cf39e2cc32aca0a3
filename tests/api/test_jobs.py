"""One job by id: read, events, cancel (producer); retry and discard (admin)."""

from __future__ import annotations

import uuid

import pytest

from evora.protocol.jobs import Events, JobResponse
from evora.storage.jobs import JobStore
from tests.api.conftest import ADMIN, PRODUCER, ApiClient, created, job_in_state, problem

UNKNOWN_IDS = [str(uuid.uuid4()), "not-a-uuid", "1234", "%E2%98%83", "batch"]
ID_ROUTES = [
    ("GET", "/v1/jobs/{}", PRODUCER),
    ("GET", "/v1/jobs/{}/events", PRODUCER),
    ("POST", "/v1/jobs/{}/cancel", PRODUCER),
    ("POST", "/v1/jobs/{}/retry", ADMIN),
    ("POST", "/v1/jobs/{}/discard", ADMIN),
]


async def test_get_returns_the_job(client: ApiClient) -> None:
    submitted = await created(client, payload=[1, "two"])
    response = await client.get(f"/v1/jobs/{submitted['id']}", headers=PRODUCER)
    assert response.status == 200
    body = await response.json()
    JobResponse.model_validate(body)
    assert body == submitted


async def test_unknown_or_malformed_id_is_job_not_found(shared_client: ApiClient) -> None:
    for method, template, headers in ID_ROUTES:
        for job_id in UNKNOWN_IDS:
            response = await shared_client.request(method, template.format(job_id), headers=headers)
            await problem(response, 404, "job_not_found")


async def test_events_oldest_first(client: ApiClient, store: JobStore) -> None:
    running = await job_in_state(client, store, "RUNNING")
    response = await client.get(f"/v1/jobs/{running['id']}/events", headers=PRODUCER)
    assert response.status == 200
    body = await response.json()
    Events.model_validate(body)
    events = body["events"]
    assert [e["event"] for e in events] == ["submitted", "claimed"]
    assert events[0]["seq"] < events[1]["seq"]
    assert (events[1]["from_state"], events[1]["to_state"]) == ("PENDING", "RUNNING")
    assert events[1]["worker_id"] == "w1"
    assert set(events[0]) >= {"seq", "job_id", "queue", "type", "event", "attempt", "at", "data"}


async def test_cancel_pending_is_immediate(client: ApiClient) -> None:
    submitted = await created(client)
    response = await client.post(f"/v1/jobs/{submitted['id']}/cancel", headers=PRODUCER)
    assert response.status == 200
    body = await response.json()
    assert body["state"] == "CANCELLED"
    assert body["finished_at"] is not None


async def test_cancel_running_is_requested(client: ApiClient, store: JobStore) -> None:
    running = await job_in_state(client, store, "RUNNING")
    for _ in range(2):  # asking again answers the same
        response = await client.post(f"/v1/jobs/{running['id']}/cancel", headers=PRODUCER)
        assert response.status == 202
        body = await response.json()
        assert (body["state"], body["cancel_requested"]) == ("RUNNING", True)


@pytest.mark.parametrize("caller", [PRODUCER, ADMIN])
async def test_cancel_leaves_a_dlq_job_to_retry_or_discard(
    client: ApiClient, store: JobStore, caller: dict[str, str]
) -> None:
    dead = await job_in_state(client, store, "DLQ")
    response = await client.post(f"/v1/jobs/{dead['id']}/cancel", headers=caller)
    body = await problem(response, 409, "invalid_state")
    assert "discard" in body["detail"]
    assert (await store.get(dead["id"]))["state"] == "DLQ"


@pytest.mark.parametrize("state", ["COMPLETED", "CANCELLED"])
async def test_cancel_final_is_invalid_state(
    client: ApiClient, store: JobStore, state: str
) -> None:
    final = await job_in_state(client, store, state)
    response = await client.post(f"/v1/jobs/{final['id']}/cancel", headers=PRODUCER)
    await problem(response, 409, "invalid_state")


async def test_retry_moves_dlq_to_pending(client: ApiClient, store: JobStore) -> None:
    dead = await job_in_state(client, store, "DLQ")
    assert dead["attempt"] == 1
    response = await client.post(f"/v1/jobs/{dead['id']}/retry", headers=ADMIN)
    assert response.status == 200
    body = await response.json()
    assert (body["state"], body["attempt"]) == ("PENDING", 0)


async def test_discard_moves_dlq_to_cancelled(client: ApiClient, store: JobStore) -> None:
    dead = await job_in_state(client, store, "DLQ")
    response = await client.post(f"/v1/jobs/{dead['id']}/discard", headers=ADMIN)
    assert response.status == 200
    assert (await response.json())["state"] == "CANCELLED"


@pytest.mark.parametrize("action", ["retry", "discard"])
@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "COMPLETED", "CANCELLED"])
async def test_retry_and_discard_need_dlq(
    client: ApiClient, store: JobStore, action: str, state: str
) -> None:
    other = await job_in_state(client, store, state)
    response = await client.post(f"/v1/jobs/{other['id']}/{action}", headers=ADMIN)
    await problem(response, 409, "invalid_state")


async def test_json_arrays_and_scalars_round_trip(client: ApiClient, store: JobStore) -> None:
    # asyncpg would read a list inside a jsonb[] parameter as a sub-array (see JobStore).
    for payload in ([1, [2, 3], {"four": 4}], [], "text", 5, None, [[1], [2, 3]]):
        submitted = await created(client, payload=payload)
        assert submitted["payload"] == payload
    submitted = await created(client, queue="results")
    [claimed] = await store.claim(worker_id="w", queues=["results"])
    await store.complete(claimed["id"], claimed["lease_token"], [1, 2])
    response = await client.get(f"/v1/jobs/{submitted['id']}", headers=PRODUCER)
    assert (await response.json())["result"] == [1, 2]
