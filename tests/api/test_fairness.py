"""The fairness endpoints and `fairness_key` on submissions, on the real api app and a real
PostgreSQL."""

from __future__ import annotations

from typing import Any

import asyncpg

from evora.storage.jobs import JobStore
from tests.api.conftest import ADMIN, PRODUCER, ApiClient, problem
from tests.conftest import Clock


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
    for method in ("PUT", "GET", "DELETE"):
        response = await client.request(
            method, "/v1/fairness/-bad", json={"weight": 1}, headers=ADMIN
        )
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


async def test_the_fair_queues_and_a_page_of_their_keys(
    client: ApiClient, store: JobStore, clock: Clock
) -> None:
    """GET /v1/fairness: the fair queues, and a queue's keys in key order with their weight
    (own or a prefix's), due backlog, longest wait, and held time against their weight's
    share, a page at a time."""

    clock._renew.append(store._pool)  # the app's pool: its connections see each advance

    async def submit(key: str) -> None:
        response = await client.post(
            "/v1/jobs", json={"queue": "q", "type": "t", "fairness_key": key}, headers=PRODUCER
        )
        assert response.status == 201, await response.text()

    for key, weight in (("gold:*", 2), ("idle", 1)):
        response = await client.put(f"/v1/fairness/{key}", json={"weight": weight}, headers=ADMIN)
        assert response.status == 201, await response.text()
    # idle's one job runs 4 s and ends: it holds all the lease time, and has no backlog
    await submit("idle")
    [job] = await store.claim(worker_id="w", queues=["q"], max_jobs=1)
    for key in ("gold:a", "gold:a", "plain"):
        await submit(key)
    await clock.advance(4)
    await store.complete(job["id"], job["lease_token"])
    # a claim that takes nothing (no job of its type) folds the ending into idle's account
    assert await store.claim(worker_id="w", queues=["q"], types=["none"]) == []

    response = await client.get("/v1/fairness", headers=ADMIN)
    assert response.status == 200, await response.text()
    body = await response.json()
    [queue] = body["queues"]
    assert (queue["queue"], queue["keys"]) == ("q", 3)
    assert body["keys"] == [] and body["next"] is None

    response = await client.get("/v1/fairness?queue=q&limit=2", headers=ADMIN)
    assert response.status == 200, await response.text()
    first = await response.json()
    assert [k["key"] for k in first["keys"]] == ["gold:a", "idle"]
    gold, idle = first["keys"]
    assert (gold["weight"], gold["set_by"], idle["set_by"]) == (2, "gold:*", "idle")
    assert gold["weight_share"] == 0.5 and idle["weight_share"] == 0.25
    assert (idle["backlog"], idle["longest_wait_seconds"], idle["held_share"]) == (0, None, 1)
    assert idle["held_seconds"] >= 4 and gold["held_share"] == 0
    assert first["next"] is not None
    response = await client.get(f"/v1/fairness?queue=q&after={first['next']}", headers=ADMIN)
    rest = await response.json()
    [plain] = rest["keys"]
    assert (plain["key"], plain["weight"], plain["set_by"], rest["next"]) == (
        "plain",
        1,
        None,
        None,
    )
    assert plain["backlog"] == 1 and plain["longest_wait_seconds"] >= 4


async def test_bad_fairness_page_parameters_are_problems(client: ApiClient) -> None:
    for query in ("queue=no%20spaces", "limit=0", "limit=501", "after=nope", "other=1"):
        response = await client.get(f"/v1/fairness?{query}", headers=ADMIN)
        await problem(response, 422, "validation_error")
    response = await client.get("/v1/fairness", headers=PRODUCER)
    await problem(response, 403, "forbidden")
