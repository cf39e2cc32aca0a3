"""/healthz, /readyz, /metrics and /openapi.json of the api service."""

from __future__ import annotations

from typing import Any

import pytest
from openapi_spec_validator import validate

from evora.config import Settings
from evora.http.routing import all_endpoints
from tests.api.conftest import ADMIN, PRODUCER, ApiClient, MakeClient, job, problem, settings_for

API_OPERATIONS = {
    ("post", "/v1/jobs"),
    ("post", "/v1/jobs/batch"),
    ("get", "/v1/jobs/{id}"),
    ("get", "/v1/jobs/{id}/events"),
    ("get", "/v1/jobs/{id}/dependents"),
    ("post", "/v1/jobs/{id}/cancel"),
    ("post", "/v1/callbacks/{callback_id}"),
    ("post", "/v1/jobs/{id}/resolve"),
    ("get", "/v1/jobs"),
    ("post", "/v1/jobs/{id}/retry"),
    ("post", "/v1/jobs/{id}/discard"),
    ("post", "/v1/queues/{queue}/redrive"),
    ("post", "/v1/queues/{queue}/pause"),
    ("post", "/v1/queues/{queue}/resume"),
    ("get", "/v1/queues"),
    ("get", "/v1/queues/{queue}/stats"),
    ("get", "/v1/queues/{queue}/failures"),
    ("get", "/v1/stats/queues/{queue}/history"),
    ("get", "/v1/stats/history"),
    ("get", "/v1/analytics"),
    ("get", "/v1/analytics/queues/{queue}"),
    ("get", "/v1/workers"),
    ("put", "/v1/schedules/{name}"),
    ("get", "/v1/schedules"),
    ("get", "/v1/schedules/{name}"),
    ("delete", "/v1/schedules/{name}"),
    ("post", "/v1/schedules/{name}/pause"),
    ("post", "/v1/schedules/{name}/resume"),
    ("post", "/v1/schedules/{name}/trigger"),
    ("put", "/v1/limits/{key}"),
    ("get", "/v1/limits"),
    ("get", "/v1/limits/{key}"),
    ("get", "/v1/limits/{key}/keys"),
    ("delete", "/v1/limits/{key}"),
    ("get", "/v1/fairness"),
    ("put", "/v1/fairness/{key}"),
    ("get", "/v1/fairness/{key}"),
    ("delete", "/v1/fairness/{key}"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
    ("get", "/"),
    ("get", "/dashboard/{file}"),
}


async def test_healthz(shared_client: ApiClient) -> None:
    response = await shared_client.get("/healthz")
    assert response.status == 200
    assert await response.json() == {"status": "ok"}


async def test_readyz_when_database_is_current(shared_client: ApiClient) -> None:
    response = await shared_client.get("/readyz")
    assert response.status == 200
    assert await response.json() == {"status": "ready"}


async def test_readyz_503_when_schema_is_behind(
    make_client: MakeClient, unmigrated_db_url: str
) -> None:
    client = await make_client(settings_for(unmigrated_db_url))
    response = await client.get("/readyz")
    assert response.status == 503
    body = await response.json()
    assert "schema" in body["reasons"][0]


async def test_readyz_503_when_database_is_unreachable(make_client: MakeClient) -> None:
    # Port 1 on loopback: nothing listens, the connection is refused at once. The service
    # still starts, so that it can say why it is not ready.
    client = await make_client(settings_for("postgresql://evora@127.0.0.1:1/evora"))
    response = await client.get("/readyz")
    assert response.status == 503
    assert "unreachable" in (await response.json())["reasons"][0]
    assert (await client.get("/healthz")).status == 200


async def test_metrics_count_requests_by_route_template(client: ApiClient) -> None:
    await client.post("/v1/jobs", json=job(), headers=PRODUCER)
    await client.get("/v1/jobs/0f8fad5b-d9cb-469f-a165-70867728950e", headers=PRODUCER)
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    text = await response.text()
    assert 'route="/v1/jobs",service="api",status="201"' in text
    assert 'route="/v1/jobs/{id}",service="api",status="404"' in text
    assert 'evora_service_info{service="api"} 1.0' in text


async def openapi(client: ApiClient) -> dict[str, Any]:
    response = await client.get("/openapi.json")
    assert response.status == 200
    document: dict[str, Any] = await response.json()
    return document


async def test_openapi_is_valid_3_1(shared_client: ApiClient) -> None:
    document = await openapi(shared_client)
    assert document["openapi"].startswith("3.1")
    validate(document)  # raises on any structural error, including unresolved $refs


async def test_openapi_lists_every_endpoint(shared_client: ApiClient) -> None:
    document = await openapi(shared_client)
    listed = {(method, path) for path, ops in document["paths"].items() for method in ops}
    assert listed == API_OPERATIONS
    routed = {(e.method.lower(), e.path) for e in all_endpoints(shared_client.app)}
    assert routed == API_OPERATIONS


# Every operation with a body may answer these (besides its own).
BODY_PROBLEMS = {"400", "401", "403", "408", "413", "422", "503"}


@pytest.mark.parametrize(
    ("method", "path", "statuses"),
    [
        (
            "post",
            "/v1/jobs",
            {"200", "201", "400", "401", "403", "408", "409", "413", "422", "429", "503"},
        ),
        (
            "post",
            "/v1/jobs/batch",
            {"200", "400", "401", "403", "408", "409", "413", "422", "429", "503"},
        ),
        ("get", "/v1/jobs/{id}", {"200", "401", "403", "404", "503"}),
        ("post", "/v1/jobs/{id}/cancel", {"200", "202", "401", "403", "404", "409", "503"}),
        ("get", "/v1/jobs", {"200", "401", "403", "422", "503"}),
        ("post", "/v1/queues/{queue}/pause", {"200", "401", "403", "422", "503"}),
    ],
)
async def test_openapi_describes_answers(
    shared_client: ApiClient, method: str, path: str, statuses: set[str]
) -> None:
    operation = (await openapi(shared_client))["paths"][path][method]
    assert set(operation["responses"]) == statuses
    assert operation["summary"]
    assert operation["security"] == [{"bearer": []}]


async def test_openapi_describes_the_list_query(shared_client: ApiClient) -> None:
    operation = (await openapi(shared_client))["paths"]["/v1/jobs"]["get"]
    names = {p["name"] for p in operation["parameters"]}
    assert names == {"queue", "state", "type", "limit", "after"}


async def test_openapi_needs_no_database(make_client: MakeClient, settings: Settings) -> None:
    client = await make_client(
        settings.model_copy(update={"database_url": "postgresql://x@127.0.0.1:1/x"})
    )
    assert (await client.get("/openapi.json")).status == 200


async def test_unknown_routes_and_methods_are_problems(shared_client: ApiClient) -> None:
    response = await shared_client.get("/v2/nothing", headers=ADMIN)
    await problem(response, 404, "not_found")
    response = await shared_client.delete("/v1/jobs", headers=ADMIN)
    await problem(response, 405, "method_not_allowed")
