"""Callbacks over HTTP (docs/callbacks.md): a suspended job holds nothing until
POST /v1/callbacks/{callback_id} resolves it (no token: the callback id is the credential),
and its next attempt sees the payload; a repeat answers the first resolution; a timeout or a
cancel settles it, and resolving after either is 409."""

from __future__ import annotations

from typing import Any

import pytest

from evora.protocol.callbacks import CallbackResolution
from evora.protocol.jobs import JobResponse, JobSubmission
from evora.storage.jobs import JobStore, Suspended
from evora.storage.rows import JobDict
from tests.api.conftest import ADMIN, PRODUCER, ApiClient, problem
from tests.conftest import Clock


async def suspended(
    store: JobStore,
    *,
    timeout_seconds: float = 60,
    on_timeout: str = "fail",
    queue: str = "q",
    **fields: Any,
) -> tuple[JobDict, Suspended]:
    """A job claimed once and suspended on a callback; the claim, and what suspending gave."""
    await store.submit(JobSubmission(queue=queue, type="t", **fields))
    [job] = await store.claim(worker_id="w1", queues=[queue])
    waiting = await store.suspend(
        job["id"], job["lease_token"], timeout_seconds=timeout_seconds, on_timeout=on_timeout
    )
    return job, waiting


async def resolve(client: ApiClient, callback_id: str, payload: Any) -> tuple[int, Any]:
    response = await client.post(f"/v1/callbacks/{callback_id}", json={"payload": payload})
    return response.status, await response.json()


async def test_a_resolved_callback_hands_its_payload_to_the_next_attempt(
    client: ApiClient, store: JobStore
) -> None:
    job, waiting = await suspended(store, max_attempts=1)
    assert waiting.callback_id is not None and waiting.callback_id.startswith("evcb_")
    held = waiting.job
    # no lease, no worker's deadline, and the attempt still counted while it waits
    assert (held["state"], held["lease_expires_at"], held["attempt"]) == ("SUSPENDED", None, 1)
    view = JobResponse.model_validate(
        await (await client.get(f"/v1/jobs/{job['id']}", headers=PRODUCER)).json()
    )
    assert view.callback is not None and view.callback.resolved_at is None
    assert (view.callback.on_timeout, view.callback.timed_out) == ("fail", False)

    # no Authorization header: the callback id is the credential
    status, first = await resolve(client, waiting.callback_id, {"approved": True})
    assert status == 200, first
    CallbackResolution.model_validate(first)
    assert (first["job_id"], first["callback"], first["payload"]) == (
        str(job["id"]),
        str(view.callback.id),
        {"approved": True},
    )
    # a repeat, whatever it carries, answers the first resolution
    assert await resolve(client, waiting.callback_id, {"approved": False}) == (200, first)

    [again] = await store.claim(worker_id="w2", queues=["q"])
    # the same attempt number: waiting used up no attempt of max_attempts=1
    assert (again["id"], again["attempt"]) == (job["id"], 1)
    assert again["callback"]["payload"] == {"approved": True}
    assert not again["callback"]["timed_out"] and again["callback"]["resolved_at"]
    done = await store.complete(again["id"], again["lease_token"], "shipped")
    assert done["state"] == "COMPLETED"
    events = await store.events(job["id"])
    assert [(e["event"], e["to_state"], e["attempt"]) for e in events] == [
        ("submitted", "PENDING", 0),
        ("claimed", "RUNNING", 1),
        ("suspended", "SUSPENDED", 1),
        ("resumed", "PENDING", 0),
        ("claimed", "RUNNING", 1),
        ("completed", "COMPLETED", 1),
    ]
    assert events[2]["data"]["callback"] == events[3]["data"]["callback"] == first["callback"]


async def test_an_unknown_callback_is_404(client: ApiClient, store: JobStore) -> None:
    await suspended(store)
    for callback_id in ("evcb_" + "0" * 64, "x" * 500, "evcb_%00", "%C3%A9"):
        status, body = await resolve(client, callback_id, None)
        assert (status, body["code"]) == (404, "callback_not_found")


@pytest.mark.parametrize(
    ("on_timeout", "max_attempts", "state", "event", "attempt"),
    [
        ("resume", 1, "PENDING", "resumed", 0),
        ("fail", 2, "PENDING", "callback_timed_out", 1),
        ("fail", 1, "DLQ", "dead_lettered", 1),
        ("dlq", 3, "DLQ", "dead_lettered", 1),
    ],
)
async def test_a_timeout_settles_the_callback_by_its_on_timeout(
    client: ApiClient,
    store: JobStore,
    clock: Clock,
    on_timeout: str,
    max_attempts: int,
    state: str,
    event: str,
    attempt: int,
) -> None:
    clock._renew.append(store._pool)
    job, waiting = await suspended(
        store, timeout_seconds=30, on_timeout=on_timeout, max_attempts=max_attempts
    )
    assert waiting.callback_id is not None
    assert await store.expire_callbacks() == []  # not due yet
    await clock.advance(31)
    # past its timeout it is refused at once, before any sweep settled it
    status, body = await resolve(client, waiting.callback_id, "late")
    assert (status, body["code"]) == (409, "callback_settled")
    [moved] = await store.expire_callbacks()
    assert (moved["id"], moved["state"], moved["attempt"]) == (job["id"], state, attempt)
    assert moved["callback"]["timed_out"] and moved["callback"]["payload"] is None
    [*_, last] = await store.events(job["id"])
    assert (last["event"], last["from_state"], last["data"]["callback"]) == (
        event,
        "SUSPENDED",
        moved["callback"]["id"],
    )
    if on_timeout != "resume":
        assert moved["last_error"]["type"] == "callback_timed_out"
    assert (await resolve(client, waiting.callback_id, "later"))[0] == 409
    assert await store.expire_callbacks() == []
    if state == "PENDING":
        await clock.advance(3600)  # past a retry's backoff
        [again] = await store.claim(worker_id="w2", queues=["q"])
        assert again["callback"]["timed_out"]
        await store.complete(again["id"], again["lease_token"])


async def test_cancelling_a_suspended_job_settles_its_callback(
    client: ApiClient, store: JobStore
) -> None:
    job, waiting = await suspended(store)
    assert waiting.callback_id is not None
    response = await client.post(f"/v1/jobs/{job['id']}/cancel", headers=PRODUCER)
    assert response.status == 200
    assert (await response.json())["state"] == "CANCELLED"
    status, body = await resolve(client, waiting.callback_id, None)
    assert (status, body["code"]) == (409, "callback_settled")
    assert (await store.get(job["id"]))["state"] == "CANCELLED"


async def test_an_admin_resolves_by_the_job(client: ApiClient, store: JobStore) -> None:
    job, waiting = await suspended(store)
    path = f"/v1/jobs/{job['id']}/resolve"
    assert (await client.post(path, json={}, headers=PRODUCER)).status == 403
    response = await client.post(path, json={"payload": "approved"}, headers=ADMIN)
    assert response.status == 200, await response.text()
    resolution = await response.json()
    assert resolution["payload"] == "approved"
    # the sender's own resolution now answers the admin's
    assert waiting.callback_id is not None
    assert await resolve(client, waiting.callback_id, "webhook") == (200, resolution)
    [again] = await store.claim(worker_id="w1", queues=["q"])
    await store.complete(again["id"], again["lease_token"])
    # a job that never suspended waits on nothing
    other = (await store.submit(JobSubmission(queue="other", type="t"))).job
    response = await client.post(f"/v1/jobs/{other['id']}/resolve", json={}, headers=ADMIN)
    await problem(response, 409, "invalid_state")


async def test_a_suspended_job_holds_no_limit_slot(client: ApiClient, store: JobStore) -> None:
    response = await client.put(
        "/v1/limits/queue:q", json={"concurrency": 1, "rate": None}, headers=ADMIN
    )
    assert response.status in (200, 201), await response.text()
    first, waiting = await suspended(store)
    await store.submit(JobSubmission(queue="q", type="t"))
    # the suspended job is not RUNNING: the one slot of queue:q is free for the next
    [second] = await store.claim(worker_id="w2", queues=["q"])
    assert second["id"] != first["id"]
    assert waiting.callback_id is not None
    assert (await resolve(client, waiting.callback_id, None))[0] == 200
    # the slot is the second's until it ends
    assert await store.claim(worker_id="w1", queues=["q"]) == []
    await store.complete(second["id"], second["lease_token"])
    [resumed] = await store.claim(worker_id="w1", queues=["q"])
    assert resumed["id"] == first["id"]
    await store.complete(resumed["id"], resumed["lease_token"])


async def test_a_suspended_job_keeps_its_groups_turn(client: ApiClient, store: JobStore) -> None:
    head, waiting = await suspended(store, group_key="g")
    later = (await store.submit(JobSubmission(queue="q", type="t", group_key="g"))).job
    # the group is ordered: nothing of it runs while its head waits
    assert await store.claim(worker_id="w1", queues=["q"], max_jobs=10) == []
    assert waiting.callback_id is not None
    assert (await resolve(client, waiting.callback_id, None))[0] == 200
    [again] = await store.claim(worker_id="w1", queues=["q"], max_jobs=10)
    assert again["id"] == head["id"]
    await store.complete(again["id"], again["lease_token"])
    [after] = await store.claim(worker_id="w1", queues=["q"], max_jobs=10)
    assert after["id"] == later["id"]
    await store.complete(after["id"], after["lease_token"])
