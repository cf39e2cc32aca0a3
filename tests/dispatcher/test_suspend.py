"""POST /v1/jobs/{id}/suspend (docs/callbacks.md): a running job suspends on a callback and
gets its one-time callback id; the lease token fences it; a requested cancel wins."""

from __future__ import annotations

import re
from uuid import uuid4

import pytest

from evora.protocol.bounds import MAX_CALLBACK_TIMEOUT_SECONDS
from evora.protocol.worker import SuspendResponse
from evora.storage.jobs import JobStore
from tests.dispatcher.conftest import Dispatcher
from tests.dispatcher.test_worker_api import claim, submit


async def test_a_suspend_answers_a_callback_id_and_frees_the_worker(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    job_id = await submit(store)
    [job] = await claim(dispatcher)
    status, answer = await dispatcher.post(
        f"/v1/jobs/{job_id}/suspend",
        {"lease_token": job["lease_token"], "timeout_seconds": 3600, "on_timeout": "resume"},
    )
    assert status == 200, answer
    SuspendResponse.model_validate(answer)
    assert re.fullmatch(r"evcb_[0-9a-f]{64}", answer["callback_id"])
    held = answer["job"]
    assert (held["state"], held["lease_expires_at"], held["attempt"]) == ("SUSPENDED", None, 1)
    assert held["callback"]["on_timeout"] == "resume"
    # the credential is not stored: only its hash is
    stored = await store._pool.fetchval(
        "SELECT count(*) FROM evora.callbacks WHERE secret_hash = sha256(convert_to($1, 'UTF8'))",
        answer["callback_id"],
    )
    assert stored == 1
    assert answer["callback_id"] not in str(await store.get(job["id"]))
    # the attempt is off the worker: its token fences nothing any more
    body = {"lease_token": job["lease_token"]}
    assert (await dispatcher.post(f"/v1/jobs/{job_id}/heartbeat", body))[0] == 409
    assert (await dispatcher.post(f"/v1/jobs/{job_id}/complete", body))[0] == 409
    assert await claim(dispatcher) == []
    resolved = await store.resolve_callback(answer["callback_id"], {"ok": 1})
    # The last claim came back empty, so the dispatcher skips the next one until the
    # resolution's NOTIFY reaches it: a long-poll, not an instant claim, sees the job.
    [again] = await claim(dispatcher, wait_seconds=10)
    assert again["callback"]["payload"] == {"ok": 1} == resolved["payload"]
    status, done = await dispatcher.post(
        f"/v1/jobs/{job_id}/complete", {"lease_token": again["lease_token"]}
    )
    assert (status, done["state"]) == (200, "COMPLETED")


async def test_a_suspend_is_fenced_and_a_cancel_wins(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    job_id = await submit(store)
    [job] = await claim(dispatcher)
    body = {"lease_token": str(uuid4()), "timeout_seconds": 60}
    assert (await dispatcher.post(f"/v1/jobs/{job_id}/suspend", body))[0] == 409
    assert (await dispatcher.post(f"/v1/jobs/{uuid4()}/suspend", body))[0] == 404
    await store.cancel(job["id"])
    body["lease_token"] = job["lease_token"]
    status, answer = await dispatcher.post(f"/v1/jobs/{job_id}/suspend", body)
    assert (status, answer["job"]["state"], answer["callback_id"]) == (200, "CANCELLED", None)
    assert await store._pool.fetchval("SELECT count(*) FROM evora.callbacks") == 0
    # the attempt is over: a repeat finds no lease
    assert (await dispatcher.post(f"/v1/jobs/{job_id}/suspend", body))[0] == 409


@pytest.mark.parametrize(
    "fields",
    [
        {"timeout_seconds": 0},
        {"timeout_seconds": MAX_CALLBACK_TIMEOUT_SECONDS + 1},
        {},
        {"timeout_seconds": 60, "on_timeout": "retry"},
    ],
)
async def test_a_suspend_needs_a_timeout_within_bounds(
    dispatcher: Dispatcher, store: JobStore, fields: dict[str, object]
) -> None:
    job_id = await submit(store)
    [job] = await claim(dispatcher)
    status, problem = await dispatcher.post(
        f"/v1/jobs/{job_id}/suspend", {"lease_token": job["lease_token"], **fields}
    )
    assert status == 422, problem
    assert (await store.get(job["id"]))["state"] == "RUNNING"
