"""Defects the schema fuzzer found, each pinned by the request that showed it."""

from __future__ import annotations

import pytest

from tests.api.conftest import PRODUCER, ApiClient, job

# asyncpg writes these two instants as PostgreSQL's -infinity and infinity and reads them
# back as naive datetimes, so the job came back with a timestamp without offset (the
# schema's date-time refuses it) and a schedule of "infinitely early/late".
INFINITY_STAND_INS = [
    "0001-01-01T00:00:00Z",
    "0001-01-01T01:00:00+01:00",
    "9999-12-31T23:59:59.999999Z",
]


@pytest.mark.parametrize("field", ["run_at", "expires_at"])
@pytest.mark.parametrize("instant", INFINITY_STAND_INS)
async def test_instants_stored_as_infinity_are_refused(
    shared_client: ApiClient, field: str, instant: str
) -> None:
    response = await shared_client.post("/v1/jobs", json=job(**{field: instant}), headers=PRODUCER)
    assert response.status == 422, await response.text()
    [error] = (await response.json(content_type=None))["errors"]
    assert error["loc"] == [field]


@pytest.mark.parametrize("field", ["run_at", "expires_at"])
@pytest.mark.parametrize("instant", ["0001-01-01T00:00:00.000001Z", "9999-12-31T23:59:59.999998Z"])
async def test_the_instants_beside_them_round_trip(
    shared_client: ApiClient, field: str, instant: str
) -> None:
    response = await shared_client.post("/v1/jobs", json=job(**{field: instant}), headers=PRODUCER)
    assert response.status == 201, await response.text()
    assert (await response.json())[field] == instant
