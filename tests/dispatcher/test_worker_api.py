"""The worker API over HTTP against a real dispatcher and PostgreSQL
(docs/http-api.md#worker-api)."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import JobStore
from tests.dispatcher.conftest import Dispatcher

# A job id no test submits; fixed, not random, since it is part of test ids, which
# pytest-xdist's workers must collect alike.
NO_SUCH_JOB = "9b0e6a1c-3d2f-4e85-a7c4-1f6d8b2e0a53"


async def submit(store: JobStore, queue: str = "q", **fields: Any) -> str:
    job = (await store.submit(JobSubmission(queue=queue, type="t", **fields))).job
    return str(job["id"])


async def claim(
    d: Dispatcher, queues: list[str] | None = None, **fields: Any
) -> list[dict[str, Any]]:
    body = {"worker_id": "w1", "queues": queues or ["q"], "wait_seconds": 0, **fields}
    status, answer = await d.post("/v1/claim", body)
    assert status == 200, answer
    jobs: list[dict[str, Any]] = answer["jobs"]
    return jobs


async def test_claim_hands_out_jobs_with_fresh_leases(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    ids = {await submit(store) for _ in range(3)}
    jobs = await claim(dispatcher, max_jobs=10)
    assert {j["id"] for j in jobs} == ids
    assert all(j["state"] == "RUNNING" and j["lease_token"] for j in jobs)
    assert len({j["lease_token"] for j in jobs}) == 3
    assert jobs[0]["run_at"].endswith("Z")
    assert await claim(dispatcher) == []


async def test_complete_fail_release_and_fencing(dispatcher: Dispatcher, store: JobStore) -> None:
    a, b, c = [await submit(store, max_attempts=2) for _ in range(3)]
    tokens = {j["id"]: j["lease_token"] for j in await claim(dispatcher, max_jobs=3)}

    status, job = await dispatcher.post(
        f"/v1/jobs/{a}/complete", {"lease_token": tokens[a], "result": {"ok": 1}}
    )
    assert status == 200 and job["state"] == "COMPLETED" and job["result"] == {"ok": 1}
    status, again = await dispatcher.post(
        f"/v1/jobs/{a}/complete", {"lease_token": tokens[a], "result": {"ok": 1}}
    )
    assert status == 200 and again == job

    status, job = await dispatcher.post(
        f"/v1/jobs/{b}/fail",
        {
            "lease_token": tokens[b],
            "error": {"message": "boom", "type": "E"},
            "retry_in_seconds": 0,
        },
    )
    assert (
        status == 200
        and job["state"] == "PENDING"
        and job["last_error"] == {"message": "boom", "type": "E"}
    )

    status, job = await dispatcher.post(f"/v1/jobs/{c}/release", {"lease_token": tokens[c]})
    assert status == 200 and job["state"] == "PENDING" and job["attempt"] == 0

    for path, body in [
        (f"/v1/jobs/{c}/heartbeat", {"lease_token": tokens[c]}),
        (f"/v1/jobs/{c}/complete", {"lease_token": tokens[c]}),
        (f"/v1/jobs/{c}/fail", {"lease_token": tokens[c], "error": {"message": "x"}}),
        (f"/v1/jobs/{c}/release", {"lease_token": tokens[c]}),
    ]:
        status, problem = await dispatcher.post(path, body)
        assert status == 409 and problem["code"] == "lease_lost", path


async def test_heartbeat_extends_lease_and_reports_cancel(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    job_id = await submit(store)
    [job] = await claim(dispatcher)
    status, beat = await dispatcher.post(
        f"/v1/jobs/{job_id}/heartbeat",
        {"lease_token": job["lease_token"], "lease_seconds": 600, "progress": {"n": 1}},
    )
    assert status == 200 and beat["cancel_requested"] is False
    assert beat["lease_expires_at"] > job["lease_expires_at"]
    await store.cancel(UUID(job_id))
    status, beat = await dispatcher.post(
        f"/v1/jobs/{job_id}/heartbeat", {"lease_token": job["lease_token"]}
    )
    assert status == 200 and beat["cancel_requested"] is True
    status, cancelled = await dispatcher.post(
        f"/v1/jobs/{job_id}/release", {"lease_token": job["lease_token"]}
    )
    assert cancelled["state"] == "CANCELLED"


async def test_batch_acks(dispatcher: Dispatcher, store: JobStore) -> None:
    ids = [await submit(store, max_attempts=1) for _ in range(3)]
    tokens = {j["id"]: j["lease_token"] for j in await claim(dispatcher, max_jobs=3)}
    missing = str(uuid4())
    status, answer = await dispatcher.post(
        "/v1/acks",
        {
            "acks": [
                {"id": ids[0], "lease_token": tokens[ids[0]], "outcome": "complete", "result": 1},
                {
                    "id": ids[1],
                    "lease_token": tokens[ids[1]],
                    "outcome": "fail",
                    "error": {"message": "x", "retryable": False},
                },
                {"id": ids[2], "lease_token": str(uuid4()), "outcome": "complete"},
                {"id": missing, "lease_token": str(uuid4()), "outcome": "complete"},
            ]
        },
    )
    assert status == 200
    assert answer["results"] == [
        {"id": ids[0], "status": 200},
        {"id": ids[1], "status": 200},
        {"id": ids[2], "status": 409},
        {"id": missing, "status": 404},
    ]
    assert (await store.get(UUID(ids[1])))["state"] == "DLQ"


async def test_claim_and_ack_metrics_count_every_item(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    """Counted once per queue or per (outcome, status) in a batch, but by item: a claim
    over two queues and an ack batch whose items conflict (a repeat, a stale token, an
    unknown id) add up as if each had been sent alone."""
    ids = [await submit(store, max_attempts=1) for _ in range(3)]
    other = await submit(store, "r")
    jobs = await claim(dispatcher, ["q", "r"], max_jobs=10)
    assert dispatcher.metric("evora_dispatcher_jobs_claimed_total", queue="q") == 3
    assert dispatcher.metric("evora_dispatcher_jobs_claimed_total", queue="r") == 1
    tokens = {j["id"]: j["lease_token"] for j in jobs}
    done = {"id": ids[0], "lease_token": tokens[ids[0]], "outcome": "complete"}
    error = {"message": "x", "retryable": False}
    status, answer = await dispatcher.post(
        "/v1/acks",
        {
            "acks": [
                done,
                done,
                {"id": ids[1], "lease_token": tokens[ids[1]], "outcome": "fail", "error": error},
                {"id": ids[2], "lease_token": str(uuid4()), "outcome": "complete"},
                {"id": other, "lease_token": str(uuid4()), "outcome": "fail", "error": error},
                {"id": str(uuid4()), "lease_token": str(uuid4()), "outcome": "complete"},
            ]
        },
    )
    assert status == 200
    assert [r["status"] for r in answer["results"]] == [200, 200, 200, 409, 409, 404]
    counted = {
        (outcome, code): dispatcher.metric(
            "evora_dispatcher_acks_total", outcome=outcome, status=code
        )
        for outcome in ("complete", "fail")
        for code in ("200", "404", "409")
    }
    assert counted == {
        ("complete", "200"): 2,
        ("complete", "404"): 1,
        ("complete", "409"): 1,
        ("fail", "200"): 1,
        ("fail", "404"): 0,
        ("fail", "409"): 1,
    }


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/v1/claim", {"worker_id": "w", "queues": []}, 422, "validation_error"),
        (
            "/v1/claim",
            {"worker_id": "w", "queues": ["q"], "max_jobs": 501},
            422,
            "validation_error",
        ),
        (
            "/v1/claim",
            {"worker_id": "w", "queues": ["q"], "wait_seconds": 61},
            422,
            "validation_error",
        ),
        ("/v1/claim", {"worker_id": "w", "queues": ["bad queue"]}, 422, "validation_error"),
        (f"/v1/jobs/{NO_SUCH_JOB}/complete", {"lease_token": str(uuid4())}, 404, "job_not_found"),
        ("/v1/jobs/not-a-uuid/complete", {"lease_token": str(uuid4())}, 404, "job_not_found"),
        (f"/v1/jobs/{NO_SUCH_JOB}/heartbeat", {"lease_token": "nope"}, 422, "validation_error"),
        (f"/v1/jobs/{NO_SUCH_JOB}/fail", {"lease_token": str(uuid4())}, 422, "validation_error"),
        ("/v1/acks", {"acks": []}, 422, "validation_error"),
        (
            "/v1/acks",
            {"acks": [{"id": str(uuid4()), "lease_token": str(uuid4()), "outcome": "fail"}]},
            422,
            "validation_error",
        ),
    ],
)
async def test_bad_requests_are_problems(
    dispatcher: Dispatcher, path: str, body: Any, status: int, code: str
) -> None:
    got, problem = await dispatcher.post(path, body)
    assert got == status and problem["code"] == code
    assert {"type", "title", "status", "detail", "code"} <= set(problem)


async def test_malformed_json_and_auth(dispatcher: Dispatcher) -> None:
    async with dispatcher.http.post(
        dispatcher.url + "/v1/claim",
        data=b"{not json",
        headers={"Authorization": "Bearer test-worker-token"},
    ) as response:
        assert response.status == 400
        assert response.content_type == "application/problem+json"
        assert (await response.json(content_type=None))["code"] == "malformed_json"
    body = {"worker_id": "w", "queues": ["q"], "wait_seconds": 0}
    status, problem = await dispatcher.post("/v1/claim", body, headers={})
    assert status == 401 and problem["code"] == "unauthorized"
    status, problem = await dispatcher.post(
        "/v1/claim", body, headers={"Authorization": "Bearer nope"}
    )
    assert status == 401
    status, problem = await dispatcher.post(
        "/v1/claim", body, headers={"Authorization": "Bearer test-producer-token"}
    )
    assert status == 403 and problem["code"] == "forbidden"
    status, _ = await dispatcher.post(
        "/v1/claim", body, headers={"Authorization": "Bearer test-admin-token"}
    )
    assert status == 200


async def test_result_over_the_limit_is_413(dispatcher: Dispatcher, store: JobStore) -> None:
    job_id = await submit(store)
    [job] = await claim(dispatcher)
    status, problem = await dispatcher.post(
        f"/v1/jobs/{job_id}/complete",
        {"lease_token": job["lease_token"], "result": "x" * 1_100_000},
    )
    assert status == 413 and problem["code"] == "payload_too_large"


async def test_health_ready_metrics_openapi(dispatcher: Dispatcher) -> None:
    async with dispatcher.http.get(dispatcher.url + "/healthz") as r:
        assert r.status == 200
    async with dispatcher.http.get(dispatcher.url + "/readyz") as r:
        assert r.status == 200
    async with dispatcher.http.get(dispatcher.url + "/metrics") as r:
        text = await r.text()
        assert r.status == 200 and "evora_dispatcher_waiting_polls" in text
    async with dispatcher.http.get(dispatcher.url + "/openapi.json") as r:
        doc = await r.json()
    assert doc["openapi"] == "3.1.0"
    for path in [
        "/v1/claim",
        "/v1/acks",
        "/v1/jobs/{id}/heartbeat",
        "/v1/jobs/{id}/complete",
        "/v1/jobs/{id}/fail",
        "/v1/jobs/{id}/release",
    ]:
        assert "post" in doc["paths"][path], path


@pytest.mark.parametrize(
    ("path", "body", "loc"),
    [
        ("/v1/jobs/{id}/complete", {"result": {"text": "a\x00b"}}, ["result"]),
        ("/v1/jobs/{id}/complete", {"result": {"\x00": 1}}, ["result"]),
        ("/v1/jobs/{id}/heartbeat", {"progress": ["\x00"]}, ["progress"]),
        (
            "/v1/acks",
            {"acks": [{"outcome": "complete"}, {"outcome": "complete", "result": "\x00"}]},
            ["acks", 1, "result"],
        ),
    ],
)
async def test_nul_is_refused_and_named_before_the_database(
    dispatcher: Dispatcher, store: JobStore, path: str, body: dict[str, Any], loc: list[Any]
) -> None:
    """PostgreSQL cannot store U+0000 in jsonb; the edge refuses it with where it was, and
    the job is untouched."""
    job_id = await submit(store)
    [job] = await claim(dispatcher)
    lease = {"id": job_id, "lease_token": job["lease_token"]}
    if "acks" in body:
        body = {"acks": [{**lease, **ack} for ack in body["acks"]]}
    else:
        body = {"lease_token": job["lease_token"], **body}
    status, problem = await dispatcher.post(path.format(id=job_id), body)
    assert status == 422, problem
    assert [e["loc"] for e in problem["errors"]] == [loc]
    assert "U+0000" in problem["errors"][0]["msg"]
    assert (await store.get(UUID(job_id)))["state"] == "RUNNING"


async def test_nul_in_a_worker_id_is_refused(dispatcher: Dispatcher) -> None:
    status, problem = await dispatcher.post(
        "/v1/claim", {"worker_id": "w\x00", "queues": ["q"], "wait_seconds": 0}
    )
    assert status == 422 and problem["errors"][0]["loc"] == ["worker_id"]
