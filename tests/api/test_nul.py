"""U+0000 is valid JSON but PostgreSQL cannot store it (jsonb, text): the edge refuses it
with where it was, before anything reaches the database, so that one such item can never
fail the statement it would share with other clients' submissions."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from tests.api.conftest import ADMIN, PRODUCER, ApiClient, job, problem


async def test_nul_in_a_batch_names_the_item(client: ApiClient, db: asyncpg.Connection) -> None:
    body = {"jobs": [job(payload={"ok": 1}), job(payload={"deep": ["a\x00"]})]}
    response = await client.post("/v1/jobs/batch", json=body, headers=PRODUCER)
    refused = await problem(response, 422, "validation_error")
    assert [e["loc"] for e in refused["errors"]] == [["jobs", 1, "payload"]]
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 0


async def test_a_nul_submission_among_concurrent_ones_fails_only_itself(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    bodies: list[dict[str, Any]] = [job(payload={"n": n}) for n in range(20)]
    bodies.insert(10, job(payload={"text": "\x00"}))
    responses = await asyncio.gather(
        *(client.post("/v1/jobs", json=body, headers=PRODUCER) for body in bodies)
    )
    statuses = [r.status for r in responses]
    assert statuses == [201] * 10 + [422] + [201] * 10
    await problem(responses[10], 422, "validation_error")
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 20


async def test_nul_in_a_queue_name_or_filter_is_refused(client: ApiClient) -> None:
    for method, path in [
        ("POST", "/v1/queues/a%00b/pause"),
        ("POST", "/v1/queues/a%00b/redrive"),
        ("GET", "/v1/jobs?queue=a%00b"),
        ("GET", "/v1/jobs?type=t%00"),
    ]:
        response = await client.request(method, path, headers=ADMIN)
        assert response.status == 422, (path, await response.text())
