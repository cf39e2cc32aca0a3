"""`Evora-Read-After` (docs/http-api.md#read-after) without a real standby: its syntax, the
api without a replica, and an EVORA_READ_DATABASE_URL that cannot serve reads (a server that
is not a standby, a port nobody listens on), whose reads the primary answers. The replica
itself: tests/e2e/test_read_replica.py."""

from __future__ import annotations

import socket
from typing import Any

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from evora.config import Settings
from evora.protocol.positions import READ_AFTER_HEADER, format_position, parse_position
from tests.api.conftest import (
    ADMIN,
    PRODUCER,
    ApiClient,
    MakeClient,
    created,
    job,
    problem,
    settings_for,
)

INVALID = ["", "x", "1/2/3", "0/", "/0", "123456789/0", "0/123456789", "-1/0", "0x1/0", "1 /0"]


def test_a_position_is_postgresql_lsn_text() -> None:
    assert parse_position("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert parse_position(" 0/0 ") == 0
    assert format_position(parse_position("FFFFFFFF/ffffffff") or 0) == "FFFFFFFF/FFFFFFFF"
    assert format_position((0x16 << 32) | 0xB374D848) == "16/B374D848"
    for text in INVALID:
        assert parse_position(text) is None, text


async def test_an_invalid_position_is_400(shared_client: ApiClient) -> None:
    for value in [*INVALID, "1/0, nonsense"]:
        headers = {**PRODUCER, READ_AFTER_HEADER: value}
        for method, path, body in [
            ("GET", "/v1/jobs/0193ad1c-f0de-7000-8000-000000000000", None),
            ("POST", "/v1/jobs", job()),
        ]:
            response = await shared_client.request(method, path, json=body, headers=headers)
            await problem(response, 400, "invalid_header")


async def test_without_a_replica_no_position_is_answered(client: ApiClient) -> None:
    # Nothing reads a replica, so there is nothing to wait for: a position is accepted and
    # none is answered, and no write pays for asking the primary its position.
    response = await client.post(
        "/v1/jobs", json=job(), headers={**PRODUCER, READ_AFTER_HEADER: "FFFFFFFF/0"}
    )
    assert response.status == 201
    assert READ_AFTER_HEADER not in response.headers
    job_id = (await response.json())["id"]
    response = await client.get(
        f"/v1/jobs/{job_id}", headers={**PRODUCER, READ_AFTER_HEADER: "FFFFFFFF/0, 1/0"}
    )
    assert response.status == 200
    assert READ_AFTER_HEADER not in response.headers


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _fallbacks(client: ApiClient) -> dict[str, float]:
    text = await (await client.get("/metrics")).text()
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "evora_read_replica_fallbacks_total"
    }


def _position(headers: Any) -> int:
    position = parse_position(headers.get(READ_AFTER_HEADER, ""))
    assert position is not None, f"no {READ_AFTER_HEADER}"
    return position


@pytest.mark.parametrize("replica", ["the primary itself", "nobody listening"])
async def test_reads_a_replica_cannot_serve_go_to_the_primary(
    make_client: MakeClient, db_url: str, plain_conn: asyncpg.Connection, replica: str
) -> None:
    read_url = (
        db_url
        if replica == "the primary itself"
        else f"postgresql://postgres@127.0.0.1:{_closed_port()}/evora"
    )
    settings: Settings = settings_for(db_url, read_database_url=read_url)
    client = await make_client(settings)

    submitted = await client.post("/v1/jobs", json=job(), headers=PRODUCER)
    assert submitted.status == 201
    written = _position(submitted.headers)
    # The primary's position after the commit: at or past it, and not past what is now.
    now = parse_position(await plain_conn.fetchval("SELECT pg_current_wal_insert_lsn()::text"))
    assert now is not None and 0 < written <= now

    job_id = (await submitted.json())["id"]
    seen = written
    for path, headers in [
        (f"/v1/jobs/{job_id}", PRODUCER),
        (f"/v1/jobs/{job_id}/events", PRODUCER),
        (f"/v1/jobs/{job_id}/dependents", PRODUCER),
        ("/v1/jobs?state=PENDING", ADMIN),
    ]:
        response = await client.get(
            path, headers={**headers, READ_AFTER_HEADER: format_position(seen)}
        )
        assert response.status == 200, await response.text()
        answered = _position(response.headers)
        assert answered >= seen  # never behind what the client sent
        seen = answered
    assert (await _fallbacks(client)).get("unavailable") == 4

    # A client's position from the future (another primary, say) is carried along, not lost.
    ahead = now + (1 << 32)
    response = await client.post(
        "/v1/jobs", json=job(), headers={**PRODUCER, READ_AFTER_HEADER: format_position(ahead)}
    )
    assert _position(response.headers) == ahead
    assert (await created(client))["state"] == "PENDING"
