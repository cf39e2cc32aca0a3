"""The schedule endpoints on the real api app and a real PostgreSQL."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

import evora
from tests.api.conftest import ADMIN, PRODUCER, ApiClient, problem

JOB = {"queue": "reports", "type": "report.build", "payload": {"kind": "daily"}}


def body(**fields: Any) -> dict[str, Any]:
    return {"cron": "0 9 * * *", "timezone": "Europe/Berlin", "job": JOB, **fields}


async def put(client: ApiClient, name: str, status: int = 201, **fields: Any) -> dict[str, Any]:
    response = await client.put(f"/v1/schedules/{name}", json=body(**fields), headers=ADMIN)
    assert response.status == status, await response.text()
    schedule: dict[str, Any] = await response.json()
    return schedule


async def test_create_read_replace_list_delete(client: ApiClient) -> None:
    created = await put(client, "nightly")
    assert created["name"] == "nightly"
    assert (created["cron"], created["timezone"], created["misfire"]) == (
        "0 9 * * *",
        "Europe/Berlin",
        "run_once",
    )
    assert created["job"]["queue"] == "reports" and created["job"]["max_attempts"] == 5
    assert "idempotency_key" not in created["job"]
    assert created["last_run_at"] is None and created["last_job_id"] is None
    next_run = datetime.fromisoformat(created["next_run_at"]).astimezone(ZoneInfo("Europe/Berlin"))
    assert (next_run.hour, next_run.minute) == (9, 0)

    replaced = await put(client, "nightly", 200, cron="@hourly", misfire="catch_up")
    assert (replaced["cron"], replaced["misfire"]) == ("@hourly", "catch_up")
    assert replaced["created_at"] == created["created_at"]

    response = await client.get("/v1/schedules/nightly", headers=ADMIN)
    assert response.status == 200
    assert await response.json() == replaced

    for name in ("a-first", "b-second"):
        await put(client, name)
    response = await client.get("/v1/schedules", params={"limit": "2"}, headers=ADMIN)
    page = await response.json()
    assert [s["name"] for s in page["schedules"]] == ["a-first", "b-second"]
    response = await client.get(
        "/v1/schedules", params={"limit": "2", "after": page["next"]}, headers=ADMIN
    )
    last = await response.json()
    assert [s["name"] for s in last["schedules"]] == ["nightly"] and last["next"] is None

    response = await client.delete("/v1/schedules/nightly", headers=ADMIN)
    assert response.status == 204
    response = await client.get("/v1/schedules/nightly", headers=ADMIN)
    await problem(response, 404, "schedule_not_found")


async def test_pause_resume_trigger(client: ApiClient) -> None:
    await put(client, "p")
    response = await client.post("/v1/schedules/p/pause", headers=ADMIN)
    paused = await response.json()
    assert paused["paused"] is True and paused["next_run_at"] is None

    response = await client.post("/v1/schedules/p/trigger", headers=ADMIN)
    assert response.status == 201, await response.text()
    job = await response.json()
    assert job["queue"] == "reports" and job["payload"] == {"kind": "daily"}
    assert job["idempotency_key"].startswith("schedule:p:trigger:")
    response = await client.get(f"/v1/jobs/{job['id']}/events", headers=PRODUCER)
    [submitted] = (await response.json())["events"]
    assert submitted["data"] == {"schedule": "p", "triggered": True}

    response = await client.post("/v1/schedules/p/resume", headers=ADMIN)
    resumed = await response.json()
    assert resumed["paused"] is False and resumed["next_run_at"] is not None
    assert resumed["last_job_id"] == job["id"]


@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({"cron": "61 * * * *"}, ["cron"]),
        ({"cron": "* * * * * *"}, ["cron"]),
        ({"cron": "0 0 30 2 *"}, ["cron"]),
        ({"timezone": "Europe/Atlantis"}, ["timezone"]),
        ({"misfire": "sometimes"}, ["misfire"]),
        ({"job": {**JOB, "idempotency_key": "k"}}, ["job", "idempotency_key"]),
        ({"job": {"queue": "bad queue", "type": "t"}}, ["job", "queue"]),
        # a tick submits one job, never a batch: "ref:" names nothing, so every firing failed
        ({"job": {**JOB, "depends_on": ["ref:x"]}}, ["job", "depends_on"]),
        # each tick's job has an idempotency key, which neither combines with
        ({"job": {**JOB, "throttle": {"key": "k", "window_seconds": 1}}}, ["job", "throttle"]),
        (
            {"job": {**JOB, "debounce": {"key": "k", "delay_seconds": 1, "max_delay_seconds": 1}}},
            ["job", "debounce"],
        ),
    ],
)
async def test_invalid_bodies_are_422(
    shared_client: ApiClient, fields: dict[str, Any], loc: list[str]
) -> None:
    response = await shared_client.put("/v1/schedules/s", json=body(**fields), headers=ADMIN)
    answer = await problem(response, 422, "validation_error")
    assert loc in [e["loc"] for e in answer["errors"]], answer


async def test_unknown_schedules_names_and_roles(shared_client: ApiClient) -> None:
    for method, path in [
        ("GET", "/v1/schedules/none"),
        ("DELETE", "/v1/schedules/none"),
        ("POST", "/v1/schedules/none/pause"),
        ("POST", "/v1/schedules/none/resume"),
        ("POST", "/v1/schedules/none/trigger"),
        ("GET", "/v1/schedules/not%20a%20name"),
        ("GET", "/v1/schedules/none%0A"),
    ]:
        response = await shared_client.request(method, path, headers=ADMIN)
        await problem(response, 404, "schedule_not_found")
    for bad in ("not%20a%20name", "trailing-newline%0A"):
        response = await shared_client.put(f"/v1/schedules/{bad}", json=body(), headers=ADMIN)
        await problem(response, 422, "validation_error")
    response = await shared_client.put("/v1/schedules/s", json=body(), headers=PRODUCER)
    await problem(response, 403, "forbidden")
    response = await shared_client.get("/v1/schedules", params={"after": "x"}, headers=ADMIN)
    await problem(response, 422, "validation_error")


async def test_sdk_methods(client: ApiClient) -> None:
    url = str(client.make_url("")).rstrip("/")
    async with evora.Client(url, "test-admin-token", timeout=10) as sdk:
        made = await sdk.put_schedule(
            "sdk", "*/5 * * * *", {"queue": "q", "type": "t"}, timezone="Asia/Kolkata"
        )
        assert (made["timezone"], made["misfire"]) == ("Asia/Kolkata", "run_once")
        again = await sdk.put_schedule("sdk", "@daily", {"queue": "q", "type": "t"}, paused=True)
        assert again["paused"] is True and again["next_run_at"] is None
        assert [s["name"] for s in await sdk.schedules()] == ["sdk"]
        assert (await sdk.resume_schedule("sdk"))["paused"] is False
        assert (await sdk.pause_schedule("sdk"))["paused"] is True
        job = await sdk.trigger_schedule("sdk")
        assert (await sdk.schedule("sdk"))["last_job_id"] == job["id"]
        with pytest.raises(evora.RequestValidationError):
            await sdk.put_schedule("sdk", "not cron", {"queue": "q", "type": "t"})
        await sdk.delete_schedule("sdk")
        with pytest.raises(evora.ScheduleNotFoundError):
            await sdk.schedule("sdk")
        with pytest.raises(evora.ScheduleNotFoundError):
            await sdk.delete_schedule("sdk")


async def test_a_job_whose_dependencies_could_never_be_met_is_422(client: ApiClient) -> None:
    """Every tick would be refused (an unknown job, or a CANCELLED one with
    on_dependency_failure "cancel"), so the PUT is; a dependency that exists is fine."""
    response = await client.post("/v1/jobs", json={"queue": "q", "type": "t"}, headers=PRODUCER)
    done = (await response.json())["id"]
    response = await client.post("/v1/jobs", json={"queue": "q", "type": "t"}, headers=PRODUCER)
    cancelled = (await response.json())["id"]
    await client.post(f"/v1/jobs/{cancelled}/cancel", headers=PRODUCER)
    unknown = "01936b2e-0000-7000-8000-000000000000"
    for depends_on, named in (([done, unknown], unknown), ([cancelled], cancelled)):
        job = {**JOB, "depends_on": depends_on}
        response = await client.put("/v1/schedules/deps", json=body(job=job), headers=ADMIN)
        answer = await problem(response, 422, "validation_error")
        assert named in answer["detail"], answer
    await put(
        client, "deps", job={**JOB, "depends_on": [cancelled], "on_dependency_failure": "run"}
    )
    await put(client, "deps", 200, job={**JOB, "depends_on": [done]})
