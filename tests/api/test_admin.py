"""Admin endpoints on many jobs and on queues: list, redrive, pause and resume."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import asyncpg
import pytest

from evora.protocol.jobs import JobList
from evora.storage.jobs import JobStore
from evora_services.api.models import encode_cursor
from tests.api.conftest import ADMIN, PRODUCER, ApiClient, job, job_in_state, problem


async def submit_many(client: ApiClient, count: int, **fields: Any) -> list[str]:
    response = await client.post(
        "/v1/jobs/batch",
        json={"jobs": [job(payload={"i": i}, **fields) for i in range(count)]},
        headers=PRODUCER,
    )
    assert response.status == 200
    return [item["job"]["id"] for item in (await response.json())["jobs"]]


async def test_list_pages_newest_first(client: ApiClient) -> None:
    ids = await submit_many(client, 7)
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        params = {"limit": "3"} | ({"after": after} if after else {})
        response = await client.get("/v1/jobs", params=params, headers=ADMIN)
        assert response.status == 200
        body = await response.json()
        JobList.model_validate(body)
        seen += [j["id"] for j in body["jobs"]]
        pages += 1
        after = body["next"]
        if after is None:
            break
        assert isinstance(after, str)
    assert pages == 3
    assert seen == ids[::-1]


async def test_list_default_limit_is_50(client: ApiClient) -> None:
    await submit_many(client, 51)
    body = await (await client.get("/v1/jobs", headers=ADMIN)).json()
    assert len(body["jobs"]) == 50
    assert body["next"] is not None


async def test_list_filters(client: ApiClient, store: JobStore) -> None:
    await submit_many(client, 2)
    await submit_many(client, 1, queue="sms", type="sms.send")
    dead = await job_in_state(client, store, "DLQ")

    async def listed(**params: str) -> list[dict[str, object]]:
        response = await client.get("/v1/jobs", params=params, headers=ADMIN)
        assert response.status == 200
        jobs: list[dict[str, object]] = (await response.json())["jobs"]
        return jobs

    assert {j["queue"] for j in await listed(queue="sms")} == {"sms"}
    assert len(await listed(queue="emails")) == 2
    assert len(await listed(type="email.send")) == 3
    assert [j["id"] for j in await listed(state="DLQ")] == [dead["id"]]
    assert await listed(queue="sms", state="DLQ") == []


@pytest.mark.parametrize(
    "params",
    [
        {"limit": "0"},
        {"limit": "501"},
        {"limit": "ten"},
        {"state": "dead"},
        {"queue": "no spaces"},
        {"after": "not-a-cursor"},
        {"after": encode_cursor(5) + "A"},
        {"after": ""},
        {"unknown": "1"},
    ],
)
async def test_list_bad_query_is_422(shared_client: ApiClient, params: dict[str, str]) -> None:
    response = await shared_client.get("/v1/jobs", params=params, headers=ADMIN)
    body = await problem(response, 422, "validation_error")
    assert body["errors"][0]["loc"][0] in params


async def test_list_accepts_its_own_cursor_of_any_id_and_the_release_before_s_of_any_seq(
    shared_client: ApiClient,
) -> None:
    # the listing's cursor holds a job's id (migration 0068); the release before's held a
    # submit_seq, which a client paging across a rolling upgrade may still send
    positions: tuple[int | UUID, ...] = (UUID(int=0), UUID(int=2**128 - 1), -(2**63), 0, 2**63 - 1)
    for position in positions:
        response = await shared_client.get(
            "/v1/jobs", params={"after": encode_cursor(position)}, headers=ADMIN
        )
        assert response.status == 200


async def test_redrive_moves_dlq_jobs_back(
    client: ApiClient, store: JobStore, db: asyncpg.Connection
) -> None:
    for type in ("a", "a", "a", "b"):
        await job_in_state(client, store, "DLQ", queue="work", type=type)
    await job_in_state(client, store, "DLQ", queue="other", type="a")

    response = await client.post(
        "/v1/queues/work/redrive", json={"type": "a", "limit": 2}, headers=ADMIN
    )
    assert response.status == 200
    assert await response.json() == {"redriven": 2}
    # An empty body means every DLQ job of the queue.
    response = await client.post("/v1/queues/work/redrive", headers=ADMIN)
    assert await response.json() == {"redriven": 2}
    states = await db.fetch("SELECT queue, state::text, count(*) FROM evora.jobs GROUP BY 1, 2")
    assert {(r["queue"], r["state"]): r["count"] for r in states} == {
        ("work", "PENDING"): 4,
        ("other", "DLQ"): 1,
    }


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"limit": 0}, ["limit"]),
        ({"limit": 1_000_001}, ["limit"]),
        ({"limit": "5"}, ["limit"]),
        ({"type": ""}, ["type"]),
        ({"everything": True}, ["everything"]),
    ],
)
async def test_redrive_bad_body_is_422(
    shared_client: ApiClient, body: dict[str, object], loc: list[str]
) -> None:
    response = await shared_client.post("/v1/queues/work/redrive", json=body, headers=ADMIN)
    problem_body = await problem(response, 422, "validation_error")
    assert problem_body["errors"][0]["loc"] == loc


async def test_redrive_malformed_body_is_400(shared_client: ApiClient) -> None:
    response = await shared_client.post("/v1/queues/work/redrive", data=b"{", headers=ADMIN)
    await problem(response, 400, "malformed_json")


async def test_pause_and_resume(client: ApiClient, store: JobStore) -> None:
    response = await client.post("/v1/queues/emails/pause", headers=ADMIN)
    assert response.status == 200
    assert await response.json() == {"queue": "emails", "paused": True}
    # A paused queue still accepts submissions, but hands nothing out.
    submitted = await client.post("/v1/jobs", json=job(), headers=PRODUCER)
    assert submitted.status == 201
    assert await store.claim(worker_id="w", queues=["emails"]) == []
    response = await client.post("/v1/queues/emails/pause", headers=ADMIN)  # idempotent
    assert response.status == 200

    response = await client.post("/v1/queues/emails/resume", headers=ADMIN)
    assert await response.json() == {"queue": "emails", "paused": False}
    assert len(await store.claim(worker_id="w", queues=["emails"])) == 1


@pytest.mark.parametrize("action", ["pause", "resume", "redrive"])
@pytest.mark.parametrize("queue", ["-leading-dash", "sp%20ace", "x" * 129, "%E2%98%83"])
async def test_bad_queue_in_path_is_422(shared_client: ApiClient, action: str, queue: str) -> None:
    response = await shared_client.post(f"/v1/queues/{queue}/{action}", headers=ADMIN)
    body = await problem(response, 422, "validation_error")
    assert body["errors"][0]["loc"] == ["path", "queue"]
