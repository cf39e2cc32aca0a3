"""Lease fencing over HTTP under real concurrency: the lease owner's complete / fail and a
stranger's (a random token, as a stale or confused worker would send) race as concurrent
requests, in both orders, so the dispatcher coalesces them into shared statements. Exactly
the owner's request changes each job; the stranger always gets 409 lease_lost."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import JobStore
from evora.storage.rows import JobDict
from tests.e2e.conftest import WORKER_HEADERS, Stack

PAIRS = 60


async def claimed(stack: Stack, queue: str, count: int) -> list[JobDict]:
    store = JobStore(stack.pool)
    await store.submit_batch(
        [JobSubmission(queue=queue, type="t", max_attempts=1) for _ in range(count)]
    )
    jobs = await store.claim(worker_id="owner", queues=[queue], max_jobs=count)
    assert len(jobs) == count
    return jobs


async def post(stack: Stack, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with stack.http.post(
        stack.dispatcher_url + path, json=body, headers=WORKER_HEADERS
    ) as response:
        return response.status, await response.json()


def outcome_body(verb: str, token: str, who: str) -> dict[str, Any]:
    if verb == "complete":
        return {"lease_token": token, "result": who}
    return {"lease_token": token, "error": {"message": who, "retryable": False}}


async def race(stack: Stack, verb: str) -> None:
    jobs = await claimed(stack, f"fence-{verb}", PAIRS)
    requests = []
    for index, job in enumerate(jobs):
        owner = outcome_body(verb, str(job["lease_token"]), "owner")
        stranger = outcome_body(verb, str(uuid.uuid4()), "stranger")
        # Half the pairs send the stranger first: either way the owner must win.
        pair = [("owner", owner), ("stranger", stranger)]
        if index % 2:
            pair.reverse()
        requests += [(job["id"], who, body) for who, body in pair]

    answers = await asyncio.gather(
        *(post(stack, f"/v1/jobs/{job_id}/{verb}", body) for job_id, _, body in requests)
    )

    by_who: dict[str, list[int]] = {"owner": [], "stranger": []}
    for (_, who, _), (status, body) in zip(requests, answers, strict=True):
        by_who[who].append(status)
        if status == 409:
            assert body["code"] == "lease_lost"
    assert by_who["owner"] == [200] * PAIRS
    assert by_who["stranger"] == [409] * PAIRS
    rows = await stack.pool.fetch(
        "SELECT state::text, result, last_error FROM evora.jobs WHERE queue = $1", f"fence-{verb}"
    )
    expected_state = "COMPLETED" if verb == "complete" else "DLQ"
    assert {r["state"] for r in rows} == {expected_state}
    if verb == "complete":
        assert {r["result"] for r in rows} == {"owner"}
    else:
        assert {r["last_error"]["message"] for r in rows} == {"owner"}
    changes = await stack.pool.fetchval(
        "SELECT count(*) FROM evora.job_events WHERE queue = $1 AND event IN ('completed', "
        "'dead_lettered')",
        f"fence-{verb}",
    )
    assert changes == PAIRS


async def test_concurrent_completes_only_the_owner_wins(stack: Stack) -> None:
    await race(stack, "complete")


async def test_concurrent_fails_only_the_owner_wins(stack: Stack) -> None:
    await race(stack, "fail")


async def test_one_acks_request_naming_a_job_twice_answers_each_item(stack: Stack) -> None:
    first, second, third = await claimed(stack, "fence-acks", 3)
    items = [
        # a wrong token, then the right one
        {"id": str(first["id"]), "lease_token": str(uuid.uuid4()), "outcome": "complete"},
        {"id": str(first["id"]), "lease_token": str(first["lease_token"]), "outcome": "complete"},
        # the right one, then a wrong one
        {
            "id": str(second["id"]),
            "lease_token": str(second["lease_token"]),
            "outcome": "fail",
            "error": {"message": "owner"},
        },
        {
            "id": str(second["id"]),
            "lease_token": str(uuid.uuid4()),
            "outcome": "fail",
            "error": {"message": "stranger"},
        },
        # the owner completes and also fails: the complete is applied first
        {
            "id": str(third["id"]),
            "lease_token": str(third["lease_token"]),
            "outcome": "fail",
            "error": {"message": "late"},
        },
        {"id": str(third["id"]), "lease_token": str(third["lease_token"]), "outcome": "complete"},
    ]
    status, body = await post(stack, "/v1/acks", {"acks": items})
    assert status == 200
    assert [r["status"] for r in body["results"]] == [409, 200, 200, 409, 409, 200]
    states = {
        r["id"]: r["state"]
        for r in await stack.pool.fetch(
            "SELECT id, state::text FROM evora.jobs WHERE queue = 'fence-acks'"
        )
    }
    assert states == {first["id"]: "COMPLETED", second["id"]: "DLQ", third["id"]: "COMPLETED"}
