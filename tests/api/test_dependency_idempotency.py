"""An idempotency key over HTTP when the submission has dependencies: `depends_on` and
`on_dependency_failure` are fields of the submission like any other, so the same key with
other dependencies is a 409 that stores nothing, and the same dependencies (in any order)
replay the first job. In a batch, a `ref:` counts as the item it names, so a batch sent
again replays even though its refs now resolve to other ids."""

from __future__ import annotations

from typing import Any

import asyncpg

from tests.api.conftest import PRODUCER, ApiClient, created, job, problem


async def _stored(db: asyncpg.Connection) -> tuple[int, int, int]:
    """Jobs, dependency edges and idempotency keys stored."""
    row = await db.fetchrow(
        "SELECT (SELECT count(*) FROM evora.jobs), (SELECT count(*) FROM evora.job_dependencies), "
        "(SELECT count(*) FROM evora.idempotency_keys)"
    )
    assert row is not None
    return row[0], row[1], row[2]


async def test_a_key_replays_the_same_dependencies_and_refuses_others(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    a, b, c = [(await created(client, queue="parents"))["id"] for _ in range(3)]
    first = job(idempotency_key="k", depends_on=[a, b])
    response = await client.post("/v1/jobs", json=first, headers=PRODUCER)
    assert response.status == 201, await response.text()
    original = await response.json()
    stored = await _stored(db)

    # the same jobs in another order are the same dependencies: the job waits for all of them
    for same in ([a, b], [b, a]):
        response = await client.post(
            "/v1/jobs", json={**first, "depends_on": same}, headers=PRODUCER
        )
        assert response.status == 200, await response.text()
        assert response.headers["Idempotent-Replayed"] == "true"
        replayed = await response.json()
        assert (replayed["id"], replayed["depends_on"]) == (original["id"], [a, b])

    changes: list[dict[str, Any]] = [
        {"depends_on": [a, c]},
        {"depends_on": [a]},
        {"depends_on": [a, b, c]},
        {"depends_on": []},
        {"on_dependency_failure": "run"},
    ]
    for change in changes:
        response = await client.post("/v1/jobs", json={**first, **change}, headers=PRODUCER)
        await problem(response, 409, "idempotency_conflict")
    assert await _stored(db) == stored


async def test_a_key_used_without_dependencies_refuses_them(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    parent = (await created(client, queue="parents"))["id"]
    first = job(idempotency_key="free", payload={"n": 1})
    response = await client.post("/v1/jobs", json=first, headers=PRODUCER)
    assert response.status == 201
    original = await response.json()
    stored = await _stored(db)
    response = await client.post(
        "/v1/jobs", json={**first, "depends_on": [parent]}, headers=PRODUCER
    )
    await problem(response, 409, "idempotency_conflict")
    # without dependencies on_dependency_failure changes nothing, and is not compared
    response = await client.post(
        "/v1/jobs", json={**first, "on_dependency_failure": "run"}, headers=PRODUCER
    )
    assert response.status == 200
    assert (await response.json())["id"] == original["id"]
    assert await _stored(db) == stored


def _batch(x: str, *, last: dict[str, Any] | None = None, plain: int = 1) -> dict[str, Any]:
    """A keyed item, an item without a key (made again by every replay), and a keyed item
    that depends on both by ref and on the existing job `x` by id."""
    return {
        "jobs": [
            job(ref="a", idempotency_key="a"),
            job(ref="plain", payload={"n": plain}),
            {**job(idempotency_key="b", depends_on=["ref:a", "ref:plain", x]), **(last or {})},
        ]
    }


async def _post_batch(client: ApiClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = await client.post("/v1/jobs/batch", json=body, headers=PRODUCER)
    assert response.status == 200, await response.text()
    items: list[dict[str, Any]] = (await response.json())["jobs"]
    return items


async def test_a_batch_sent_again_replays_its_refs_and_refuses_other_dependencies(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    x, y = [(await created(client, queue="parents"))["id"] for _ in range(2)]
    first = await _post_batch(client, _batch(x))
    assert [item["status"] for item in first] == [201, 201, 201]
    a, plain, b = (item["job"] for item in first)
    assert b["depends_on"] == [a["id"], plain["id"], x]

    # sent again: "ref:a" now names the replayed job a (the same id), "ref:plain" a new job
    # with the same fields; b is the same submission and replays
    again = await _post_batch(client, _batch(x))
    assert [item["status"] for item in again] == [200, 201, 200]
    assert again[0]["job"]["id"] == a["id"] and again[2]["job"]["id"] == b["id"]
    assert again[1]["job"]["id"] != plain["id"]
    # its dependencies listed in another order
    reordered = _batch(x, last={"depends_on": [x, "ref:plain", "ref:a"]})
    assert [item["status"] for item in await _post_batch(client, reordered)] == [200, 201, 200]
    stored = await _stored(db)

    for body in (
        _batch(x, last={"depends_on": ["ref:a", "ref:plain", y]}),
        _batch(x, last={"depends_on": ["ref:a", x]}),
        _batch(x, last={"on_dependency_failure": "run"}),
        # the item it names by ref is not the same submission as the first time
        _batch(x, plain=2),
    ):
        response = await client.post("/v1/jobs/batch", json=body, headers=PRODUCER)
        body_of = await problem(response, 409, "idempotency_conflict")
        assert "'b'" in body_of["detail"]
    assert await _stored(db) == stored


async def test_a_key_repeated_in_one_batch_with_other_dependencies_names_both_items(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    x = (await created(client, queue="parents"))["id"]
    stored = await _stored(db)
    body = {
        "jobs": [
            job(ref="p"),
            job(idempotency_key="r", depends_on=[x]),
            job(idempotency_key="r", depends_on=["ref:p"]),
        ]
    }
    response = await client.post("/v1/jobs/batch", json=body, headers=PRODUCER)
    problem_body = await problem(response, 409, "idempotency_conflict")
    assert problem_body["detail"].startswith("jobs[2] reuses the idempotency key of jobs[1]")
    assert await _stored(db) == stored
