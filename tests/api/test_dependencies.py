"""Dependencies over HTTP: submitting them (single and batch refs), the 422s naming the
field, and GET /v1/jobs/{id}/dependents."""

from __future__ import annotations

import uuid

from tests.api.conftest import PRODUCER, ApiClient, created, job, problem


async def test_a_batch_with_refs_stores_the_graph_and_lists_dependents(
    client: ApiClient,
) -> None:
    response = await client.post(
        "/v1/jobs/batch",
        json={
            "jobs": [
                job(ref="a"),
                job(ref="b", depends_on=["ref:a"]),
                job(depends_on=["ref:a", "ref:b"], on_dependency_failure="run"),
            ]
        },
        headers=PRODUCER,
    )
    assert response.status == 200, await response.text()
    a, b, c = (item["job"] for item in (await response.json())["jobs"])
    assert (a["state"], b["state"], c["state"]) == ("PENDING", "WAITING", "WAITING")
    assert c["depends_on"] == [a["id"], b["id"]]
    got = await client.get(f"/v1/jobs/{c['id']}", headers=PRODUCER)
    assert (await got.json())["depends_on"] == [a["id"], b["id"]]

    first = await client.get(f"/v1/jobs/{a['id']}/dependents?limit=1", headers=PRODUCER)
    assert first.status == 200
    page = await first.json()
    assert [j["id"] for j in page["jobs"]] == [b["id"]] and page["next"]
    rest = await client.get(f"/v1/jobs/{a['id']}/dependents?after={page['next']}", headers=PRODUCER)
    assert await rest.json() == {"jobs": [c], "next": None}
    none = await client.get(f"/v1/jobs/{c['id']}/dependents", headers=PRODUCER)
    assert await none.json() == {"jobs": [], "next": None}


async def test_dependents_of_an_unknown_job_is_404(client: ApiClient) -> None:
    response = await client.get(f"/v1/jobs/{uuid.uuid4()}/dependents", headers=PRODUCER)
    await problem(response, 404, "job_not_found")


async def test_an_unknown_dependency_is_a_422_naming_the_field(client: ApiClient) -> None:
    parent = await created(client)
    missing = uuid.uuid4()
    response = await client.post(
        "/v1/jobs", json=job(depends_on=[parent["id"], str(missing)]), headers=PRODUCER
    )
    body = await problem(response, 422, "validation_error")
    assert body["detail"].startswith(f"depends_on[1]: {missing}")
    response = await client.post(
        "/v1/jobs/batch",
        json={"jobs": [job(), job(depends_on=["ref:later"]), job(ref="later")]},
        headers=PRODUCER,
    )
    body = await problem(response, 422, "validation_error")
    assert body["detail"].startswith("jobs[1].depends_on[0]")


async def test_depends_on_is_validated_like_every_field(client: ApiClient) -> None:
    parent = str(uuid.uuid4())
    for bad in (
        {"depends_on": [parent, parent]},
        {"depends_on": ["not-a-ref"]},
        {"depends_on": [str(uuid.uuid4()) for _ in range(1001)]},
        {"on_dependency_failure": "ignore"},
    ):
        response = await client.post("/v1/jobs", json=job(**bad), headers=PRODUCER)
        await problem(response, 422, "validation_error")


async def test_cancelling_a_waiting_job_cancels_its_waiting_dependents_that_would_cancel(
    client: ApiClient,
) -> None:
    """a <- b <- {c (cancel), d (run)} and c <- e: cancelling b (WAITING) cancels it and,
    transitively, c and e; d runs anyway once its dependencies are final."""
    response = await client.post(
        "/v1/jobs/batch",
        json={
            "jobs": [
                job(ref="a"),
                job(ref="b", depends_on=["ref:a"]),
                job(ref="c", depends_on=["ref:b"]),
                job(ref="d", depends_on=["ref:b"], on_dependency_failure="run"),
                job(depends_on=["ref:c"]),
            ]
        },
        headers=PRODUCER,
    )
    assert response.status == 200, await response.text()
    a, b, c, d, e = (item["job"]["id"] for item in (await response.json())["jobs"])

    cancelled = await client.post(f"/v1/jobs/{b}/cancel", headers=PRODUCER)
    assert cancelled.status == 200, await cancelled.text()
    assert (await cancelled.json())["state"] == "CANCELLED"

    async def state(job_id: str) -> str:
        got = await client.get(f"/v1/jobs/{job_id}", headers=PRODUCER)
        return str((await got.json())["state"])

    assert [await state(j) for j in (a, b, c, d, e)] == [
        "PENDING",
        "CANCELLED",
        "CANCELLED",
        "PENDING",
        "CANCELLED",
    ]
    events = await client.get(f"/v1/jobs/{e}/events", headers=PRODUCER)
    last = (await events.json())["events"][-1]
    assert (last["event"], last["data"]) == (
        "cancelled",
        {"reason": "dependency_cancelled", "dependency": c},
    )
    # a CANCELLED job stays refused
    again = await client.post(f"/v1/jobs/{b}/cancel", headers=PRODUCER)
    await problem(again, 409, "invalid_state")
