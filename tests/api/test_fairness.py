"""The fairness endpoints and `fairness_key` on submissions, on the real api app and a real
PostgreSQL."""

from __future__ import annotations

from typing import Any

import asyncpg

from evora.storage.jobs import JobStore
from tests.api.conftest import ADMIN, PRODUCER, ApiClient, problem


async def _weight(client: ApiClient, key: str) -> dict[str, Any]:
    response = await client.get(f"/v1/fairness/{key}", headers=ADMIN)
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def test_set_read_and_drop_weights_by_key_and_prefix(client: ApiClient) -> None:
    response = await client.put("/v1/fairness/gold:*", json={"weight": 4}, headers=ADMIN)
    assert response.status == 201, await response.text()
    assert (await response.json())["weight"] == 4
    response = await client.put("/v1/fairness/gold:*", json={"weight": 5}, headers=ADMIN)
    assert response.status == 200
    response = await client.put("/v1/fairness/gold:acme", json={"weight": 0.5}, headers=ADMIN)
    assert response.status == 201

    assert (await _weight(client, "gold:other"))["weight"] == 5
    assert (await _weight(client, "gold:other"))["set_by"] == "gold:*"
    assert (await _weight(client, "gold:acme"))["weight"] == 0.5
    assert await _weight(client, "bronze:x") == {
        "key": "bronze:x",
        "weight": 1,
        "set_by": None,
        "queues": [],
    }

    response = await client.delete("/v1/fairness/gold:acme", headers=ADMIN)
    assert response.status == 204
    assert (await _weight(client, "gold:acme"))["weight"] == 5
    response = await client.delete("/v1/fairness/gold:acme", headers=ADMIN)
    assert response.status == 204


async def test_invalid_weights_and_keys_are_422(client: ApiClient) -> None:
    for body in ({"weight": 0}, {"weight": 1001}, {}, {"weight": 1, "other": 2}):
        response = await client.put("/v1/fairness/a", json=body, headers=ADMIN)
        await problem(response, 422, "validation_error")
    response = await client.put("/v1/fairness/-bad", json={"weight": 1}, headers=ADMIN)
    await problem(response, 422, "validation_error")
    # a GET or DELETE names its key in the same alphabet (the schema fuzzer's DELETE of a
    # key with control characters was answered 204)
    for bad in ("-bad", "%C3%A2%13%5D"):
        await problem(
            await client.get(f"/v1/fairness/{bad}", headers=ADMIN), 422, "validation_error"
        )
        response = await client.delete(f"/v1/fairness/{bad}", headers=ADMIN)
        await problem(response, 422, "validation_error")
    response = await client.post(
        "/v1/jobs", json={"queue": "q", "type": "t", "fairness_key": "no spaces"}, headers=PRODUCER
    )
    await problem(response, 422, "validation_error")


async def test_weights_are_for_admins(client: ApiClient) -> None:
    response = await client.put("/v1/fairness/a", json={"weight": 2}, headers=PRODUCER)
    await problem(response, 403, "forbidden")
    response = await client.get("/v1/fairness/a", headers=PRODUCER)
    await problem(response, 403, "forbidden")


async def test_a_keyed_submission_is_served_and_shown(
    client: ApiClient, store: JobStore, pool: asyncpg.Pool
) -> None:
    response = await client.post(
        "/v1/jobs", json={"queue": "q", "type": "t", "fairness_key": "tenant:a"}, headers=PRODUCER
    )
    assert response.status == 201, await response.text()
    job = await response.json()
    assert job["fairness_key"] == "tenant:a"
    [claimed] = await store.claim(worker_id="w", queues=["q"], max_jobs=10)
    assert claimed["fairness_key"] == "tenant:a"
    await store.complete(claimed["id"], claimed["lease_token"])
    # the next claim folds the ending into the key's account
    assert await store.claim(worker_id="w", queues=["q"], max_jobs=10) == []
    [served] = (await _weight(client, "tenant:a"))["queues"]
    assert (served["queue"], served["served"], served["running"]) == ("q", 1, 0)
    assert served["held_seconds"] >= 0
