"""The bodies that carry acks (`POST /v1/claim` and `POST /v1/acks`), against a real
dispatcher and PostgreSQL: parsed by a lean path that checks every result in one pass,
they are still answered exactly as the documented models answer, and each result reaches
its job as sent."""

from __future__ import annotations

import json
from typing import Any
from uuid import uuid4

import asyncpg
import orjson
import pytest
from pydantic import BaseModel, ValidationError

from evora.http.bodies import problem_from
from evora.protocol.bounds import DEFAULT_MAX_PAYLOAD_BYTES, MAX_ACKS
from evora.protocol.worker import AcksRequest, ClaimRequest
from evora.storage.jobs import JobStore
from tests.dispatcher.conftest import WORKER, Dispatcher
from tests.dispatcher.test_worker_api import claim, submit


def _ack(**fields: Any) -> dict[str, Any]:
    return {"id": str(uuid4()), "lease_token": str(uuid4()), "outcome": "complete", **fields}


_TOO_LARGE = "x" * (DEFAULT_MAX_PAYLOAD_BYTES + 1)

# Lists of acks each documented model refuses, for a different reason or several at once.
BAD_ACKS = {
    "result too large": [_ack(), _ack(result={"big": _TOO_LARGE})],
    "NUL in a result": [_ack(result="a\u0000b")],
    "bad id beside a result too large": [_ack(id="nope"), _ack(result=[_TOO_LARGE])],
    "fail without an error, result too large": [_ack(outcome="fail", result=_TOO_LARGE)],
    "fail without an error": [_ack(), _ack(outcome="fail")],
    "unknown field": [_ack(extra=1)],
    "unknown outcome": [_ack(outcome="done")],
    "token not a string": [_ack(lease_token=7)],
    "too many": [_ack() for _ in range(MAX_ACKS + 1)],
    "too many, one result too large": [_ack(result=_TOO_LARGE)] + [_ack()] * MAX_ACKS,
}

_ENDPOINTS: dict[str, tuple[type[BaseModel], dict[str, Any]]] = {
    "/v1/claim": (ClaimRequest, {"worker_id": "w1", "queues": ["q"], "wait_seconds": 0}),
    "/v1/acks": (AcksRequest, {}),
}


def _documented_answer(model: type[BaseModel], body: dict[str, Any]) -> tuple[int, Any]:
    """What the documented model alone makes of `body`: the problem it raises."""
    context = {"max_payload_bytes": DEFAULT_MAX_PAYLOAD_BYTES}
    with pytest.raises(ValidationError) as refused:
        model.model_validate_json(json.dumps(body), context=context)
    problem = problem_from(refused.value).response()
    assert isinstance(problem.body, bytes)
    return problem.status, orjson.loads(problem.body)


@pytest.mark.parametrize("path", list(_ENDPOINTS))
@pytest.mark.parametrize("case", list(BAD_ACKS))
async def test_bad_acks_are_answered_as_the_documented_models_answer(
    dispatcher: Dispatcher, path: str, case: str
) -> None:
    model, fields = _ENDPOINTS[path]
    body = {**fields, "acks": BAD_ACKS[case]}
    status, problem = await dispatcher.post(path, body)
    assert (status, problem) == _documented_answer(model, body)
    assert status in (413, 422)


async def test_empty_acks_are_refused_as_documented(dispatcher: Dispatcher) -> None:
    status, problem = await dispatcher.post("/v1/acks", {"acks": []})
    assert (status, problem) == _documented_answer(AcksRequest, {"acks": []})


RESULTS: list[Any] = [
    None,
    [1, [2, 3]],
    {"a": {"b": "ü"}},
    "text",
    2.5,
    True,
    0,
    {},
    2**70,  # beyond 64 bits: jsonb holds it, and so it is stored
]


@pytest.mark.parametrize("path", list(_ENDPOINTS))
async def test_each_result_reaches_its_job_as_sent(
    dispatcher: Dispatcher, store: JobStore, path: str
) -> None:
    for _ in range(len(RESULTS) + 1):
        await submit(store)
    jobs = await claim(dispatcher, max_jobs=len(RESULTS) + 1)
    # One ack per result, and a last one that sends none.
    acks = [
        {"id": job["id"], "lease_token": job["lease_token"], "outcome": "complete"} for job in jobs
    ]
    for ack, result in zip(acks, RESULTS, strict=False):
        ack["result"] = result
    _, fields = _ENDPOINTS[path]
    status, answer = await dispatcher.post(path, {**fields, "acks": acks})
    assert status == 200, answer
    assert answer["results"] == [{"id": job["id"], "status": 200} for job in jobs]
    for job, result in zip(jobs, [*RESULTS, None], strict=True):
        stored = await store.get(job["id"])
        assert stored["state"] == "COMPLETED"
        # as JSON: a number no float holds is read as its text (an orjson fragment)
        assert json.loads(orjson.dumps(stored["result"])) == result


# A result as the worker's JSON writes it, sent raw: never through a Python float.
EXACT_RESULT = '{"digits": 12345678901234567.89, "big": 123456789012345678901234567891, "e": 1e2}'
_RAW = "<the result>"


async def test_results_and_progress_keep_the_workers_numbers_exactly(
    dispatcher: Dispatcher, store: JobStore, plain_conn: asyncpg.Connection
) -> None:
    """Every way a result or progress comes in stores the numbers as jsonb reads them from
    the worker's JSON (as evora's SQL would), not as a float or a 64-bit integer has them."""
    for _ in range(4):
        await submit(store)
    jobs = await claim(dispatcher, max_jobs=4)
    claim_ack, acks_ack, completed, beating = jobs

    def ack(job: dict[str, Any]) -> dict[str, Any]:
        return {"id": job["id"], "lease_token": job["lease_token"], "outcome": "complete"}

    envelopes: dict[str, dict[str, Any]] = {
        "/v1/claim": {
            "worker_id": "w1",
            "queues": ["q"],
            "wait_seconds": 0,
            "acks": [{**ack(claim_ack), "result": _RAW}],
        },
        "/v1/acks": {"acks": [{**ack(acks_ack), "result": _RAW}]},
        f"/v1/jobs/{completed['id']}/complete": {
            "lease_token": completed["lease_token"],
            "result": _RAW,
        },
        f"/v1/jobs/{beating['id']}/heartbeat": {
            "lease_token": beating["lease_token"],
            "progress": _RAW,
        },
    }
    # the result's JSON text in place of its stand-in
    bodies = {
        path: orjson.dumps(envelope).replace(orjson.dumps(_RAW), EXACT_RESULT.encode())
        for path, envelope in envelopes.items()
    }
    for path, body in bodies.items():
        async with dispatcher.http.post(
            dispatcher.url + path,
            data=body,
            headers={**WORKER, "Content-Type": "application/json"},
        ) as response:
            assert response.status == 200, await response.text()
    stored = await plain_conn.fetch(
        "SELECT coalesce(result, progress)::text AS value, $1::jsonb::text AS exact "
        "FROM evora.jobs ORDER BY id",
        EXACT_RESULT,
    )
    assert len(stored) == 4
    for row in stored:
        assert row["value"] == row["exact"]
