"""POST /v1/jobs/batch: one transaction, request order, all-or-nothing validation."""

from __future__ import annotations

from typing import Any

import asyncpg

from evora.config import Settings
from evora.protocol.jobs import BatchResult
from tests.api.conftest import PRODUCER, ApiClient, MakeClient, job, problem


async def test_batch_answers_in_request_order(client: ApiClient, db: asyncpg.Connection) -> None:
    first = await client.post("/v1/jobs", json=job(idempotency_key="seen"), headers=PRODUCER)
    existing = (await first.json())["id"]
    jobs = [
        job(payload={"i": 0}),
        job(idempotency_key="seen"),
        job(queue="sms", type="sms.send", priority=-5),
        job(idempotency_key="new"),
        job(idempotency_key="new"),  # a repeat inside the batch replays the item before it
    ]
    response = await client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=PRODUCER)
    assert response.status == 200
    body = await response.json()
    BatchResult.model_validate(body)
    items = body["jobs"]
    assert [item["status"] for item in items] == [201, 200, 201, 201, 200]
    assert items[0]["job"]["payload"] == {"i": 0}
    assert items[1]["job"]["id"] == existing
    assert (items[2]["job"]["queue"], items[2]["job"]["priority"]) == ("sms", -5)
    assert items[3]["job"]["id"] == items[4]["job"]["id"]
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 4


async def test_an_item_keeps_the_fields_its_neighbours_leave_out(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    # A batch whose items set only queue, type and payload is stored with each other column
    # read once (evora.storage.submissions._defaults_only); one item that sets them is not.
    given: dict[str, Any] = {
        "priority": 7,
        "delay_seconds": 60,
        "max_attempts": 9,
        "lease_seconds": 45,
        "backoff": {"initial_seconds": 2, "max_seconds": 20, "multiplier": 3},
        "expires_at": "2999-01-01T00:00:00Z",
        "idempotency_key": "k",
        "group_key": "g",
        "limit_keys": ["a", "b"],
        "max_duration_seconds": 90,
        "fairness_key": "tenant",
        "on_dependency_failure": "run",
    }
    jobs = [job(payload={"i": i}) for i in range(3)]
    jobs.insert(1, job(payload={"i": "set"}, **given))
    response = await client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=PRODUCER)
    assert response.status == 200, await response.text()
    rows = await db.fetch(
        "SELECT payload->>'i' AS i, priority, run_at > created_at AS later, max_attempts,"
        " lease_seconds, backoff_initial, backoff_max, backoff_multiplier, expires_at IS NOT NULL,"
        " idempotency_key, group_key, limit_keys, max_duration_seconds, fairness_key,"
        " on_dependency_failure FROM evora.jobs ORDER BY payload->>'i'"
    )
    plain: tuple[Any, ...] = (
        0,
        False,
        5,
        30,
        # the default backoff and on_dependency_failure are stored as NULL (migration 0067)
        None,
        None,
        None,
        False,
        None,
        None,
        [],
        None,
        None,
        None,
    )
    assert [tuple(r) for r in rows] == [
        ("0", *plain),
        ("1", *plain),
        ("2", *plain),
        ("set", 7, True, 9, 45, 2.0, 20.0, 3.0, True, "k", "g", ["a", "b"], 90, "tenant", "run"),
    ]


async def test_one_invalid_item_stores_nothing(client: ApiClient, db: asyncpg.Connection) -> None:
    jobs = [job(payload={"i": i}) for i in range(5)]
    jobs[3]["queue"] = "not a queue!"
    response = await client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=PRODUCER)
    body = await problem(response, 422, "validation_error")
    assert [e["loc"] for e in body["errors"]] == [["jobs", 3, "queue"]]
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 0


async def test_oversized_payload_names_its_index(
    make_client: MakeClient, settings: Settings, db: asyncpg.Connection
) -> None:
    client = await make_client(settings.model_copy(update={"max_payload_bytes": 100}))
    jobs = [job(), job(), job(payload="x" * 200)]
    response = await client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=PRODUCER)
    body = await problem(response, 413, "payload_too_large")
    assert "jobs.2.payload" in body["detail"]
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 0


async def test_payloads_over_the_limit_together_but_not_alone_are_stored(
    make_client: MakeClient, settings: Settings, db: asyncpg.Connection
) -> None:
    # The batch's payloads are checked together first; over the limit together is not a
    # reason to refuse, only to check them one by one.
    client = await make_client(settings.model_copy(update={"max_payload_bytes": 100}))
    jobs = [job(payload="x" * 90) for _ in range(3)]
    response = await client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=PRODUCER)
    assert response.status == 200
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 3


async def test_an_oversized_payload_beside_another_error_answers_as_checked_one_by_one(
    make_client: MakeClient, settings: Settings, db: asyncpg.Connection
) -> None:
    client = await make_client(settings.model_copy(update={"max_payload_bytes": 100}))
    jobs = [job(payload="x" * 200), job(priority="high"), job(payload="a\u0000b")]
    response = await client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=PRODUCER)
    body = await problem(response, 413, "payload_too_large")
    assert "jobs.0.payload" in body["detail"]
    response = await client.post("/v1/jobs/batch", json={"jobs": jobs[1:]}, headers=PRODUCER)
    body = await problem(response, 422, "validation_error")
    assert [e["loc"] for e in body["errors"]] == [["jobs", 0, "priority"], ["jobs", 1, "payload"]]
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 0


async def test_conflicting_keys_store_nothing(client: ApiClient, db: asyncpg.Connection) -> None:
    await client.post("/v1/jobs", json=job(idempotency_key="k", priority=1), headers=PRODUCER)
    jobs = [job(), job(idempotency_key="k", priority=2)]
    response = await client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=PRODUCER)
    await problem(response, 409, "idempotency_conflict")
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 1


async def test_batch_size_is_1_to_1000(client: ApiClient, db: asyncpg.Connection) -> None:
    for jobs in ([], [job()] * 1001):
        response = await client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=PRODUCER)
        body = await problem(response, 422, "validation_error")
        assert body["errors"][0]["loc"] == ["jobs"]
    response = await client.post("/v1/jobs/batch", json={"jobs": [job()] * 1000}, headers=PRODUCER)
    assert response.status == 200
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 1000


async def test_batch_body_must_be_an_object_with_jobs(shared_client: ApiClient) -> None:
    response = await shared_client.post("/v1/jobs/batch", data=b"", headers=PRODUCER)
    body = await problem(response, 422, "validation_error")
    assert body["errors"][0]["loc"] == ["jobs"]
    response = await shared_client.post("/v1/jobs/batch", data=b"[", headers=PRODUCER)
    await problem(response, 400, "malformed_json")


async def test_oversized_batch_body_is_413(shared_client: ApiClient) -> None:
    body = b'{"jobs": [' + b" " * (16 * 1024 * 1024) + b"]}"
    response = await shared_client.post("/v1/jobs/batch", data=body, headers=PRODUCER)
    await problem(response, 413, "payload_too_large")


async def test_prefer_return_minimal_answers_ids_and_statuses(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    for n, prefer in enumerate(("return=minimal", 'handling=lenient, RETURN="minimal"; x=1')):
        jobs = [job(idempotency_key=f"k{n}"), job(idempotency_key=f"k{n}"), job()]
        response = await client.post(
            "/v1/jobs/batch", json={"jobs": jobs}, headers={**PRODUCER, "Prefer": prefer}
        )
        assert response.status == 200
        assert response.headers["Preference-Applied"] == "return=minimal"
        items = (await response.json())["jobs"]
        assert [item["status"] for item in items] == [201, 200, 201]
        assert all(set(item) == {"id", "status"} for item in items)
        assert items[0]["id"] == items[1]["id"] != items[2]["id"]
        stored = await db.fetchval(
            "SELECT count(*) FROM evora.jobs WHERE id::text = ANY($1)", [i["id"] for i in items]
        )
        assert stored == 2
    # Without the preference (or with another), whole jobs as before.
    response = await client.post(
        "/v1/jobs/batch",
        json={"jobs": [job()]},
        headers={**PRODUCER, "Prefer": "return=representation"},
    )
    assert "Preference-Applied" not in response.headers
    BatchResult.model_validate(await response.json())
