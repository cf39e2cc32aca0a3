"""Who may call what (docs/http-api.md#authentication): 401 without a known token, 403 for
the wrong role."""

from __future__ import annotations

import pytest

from evora.config import Settings
from tests.api.conftest import ADMIN, PRODUCER, WORKER, ApiClient, MakeClient, job, problem

# Fixed, not random: the id is part of the test ids, which pytest-xdist's workers must agree on.
SOME_ID = "5d1c0a4e-6f0b-4c3e-9a57-2b8e1f4d7c90"
PRODUCER_ROUTES = [
    ("POST", "/v1/jobs"),
    ("POST", "/v1/jobs/batch"),
    ("GET", f"/v1/jobs/{SOME_ID}"),
    ("GET", f"/v1/jobs/{SOME_ID}/events"),
    ("POST", f"/v1/jobs/{SOME_ID}/cancel"),
]
ADMIN_ROUTES = [
    ("GET", "/v1/jobs"),
    ("POST", f"/v1/jobs/{SOME_ID}/retry"),
    ("POST", f"/v1/jobs/{SOME_ID}/discard"),
    ("POST", "/v1/queues/emails/redrive"),
    ("POST", "/v1/queues/emails/pause"),
    ("POST", "/v1/queues/emails/resume"),
]
PUBLIC_ROUTES = ["/healthz", "/readyz", "/metrics", "/openapi.json"]

BAD_CREDENTIALS = [
    {},
    {"Authorization": "Bearer nope"},
    {"Authorization": "Bearer "},
    {"Authorization": "Basic YTph"},
    {"Authorization": "a"},
]


@pytest.mark.parametrize(("method", "path"), PRODUCER_ROUTES + ADMIN_ROUTES)
async def test_missing_or_unknown_token_is_401(
    shared_client: ApiClient, method: str, path: str
) -> None:
    for headers in BAD_CREDENTIALS:
        response = await shared_client.request(method, path, headers=headers)
        await problem(response, 401, "unauthorized")
        assert response.headers["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path"), PRODUCER_ROUTES + ADMIN_ROUTES)
async def test_worker_may_call_nothing_here(
    shared_client: ApiClient, method: str, path: str
) -> None:
    response = await shared_client.request(method, path, headers=WORKER)
    await problem(response, 403, "forbidden")


@pytest.mark.parametrize(("method", "path"), ADMIN_ROUTES)
async def test_producer_may_not_call_admin_routes(
    shared_client: ApiClient, method: str, path: str
) -> None:
    response = await shared_client.request(method, path, headers=PRODUCER)
    await problem(response, 403, "forbidden")


async def test_auth_comes_before_the_body(shared_client: ApiClient) -> None:
    # A stranger learns nothing about validation, sizes or which jobs exist.
    response = await shared_client.post("/v1/jobs", data=b"{not json", headers={})
    await problem(response, 401, "unauthorized")
    response = await shared_client.post("/v1/jobs", data=b"{not json", headers=WORKER)
    await problem(response, 403, "forbidden")


async def test_admin_may_call_producer_routes(shared_client: ApiClient) -> None:
    response = await shared_client.post("/v1/jobs", json=job(), headers=ADMIN)
    assert response.status == 201
    job_id = (await response.json())["id"]
    for method, path in [
        ("GET", f"/v1/jobs/{job_id}"),
        ("GET", f"/v1/jobs/{job_id}/events"),
        ("POST", f"/v1/jobs/{job_id}/cancel"),
    ]:
        assert (await shared_client.request(method, path, headers=ADMIN)).status == 200


@pytest.mark.parametrize("path", PUBLIC_ROUTES)
async def test_operations_routes_need_no_token(shared_client: ApiClient, path: str) -> None:
    response = await shared_client.get(path)
    assert response.status == 200


async def test_auth_disabled_lets_anyone_in(make_client: MakeClient, settings: Settings) -> None:
    client = await make_client(settings.model_copy(update={"auth": "disabled", "tokens": None}))
    response = await client.post("/v1/jobs", json=job())
    assert response.status == 201
    job_id = (await response.json())["id"]
    assert (await client.get(f"/v1/jobs/{job_id}")).status == 200
    assert (await client.get("/v1/jobs", headers={"Authorization": "Bearer junk"})).status == 200
    assert (await client.post("/v1/queues/emails/pause")).status == 200
