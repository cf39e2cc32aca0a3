"""One rule set for JSON over HTTP and in SQL (evora.submit): a payload keeps the client's
numbers exactly (jsonb does; a detour through Python floats or 64-bit integers did not), the
integer fields take the same numbers, and timestamps round to microseconds the same way. So
the same submission with the same idempotency key replays its job whichever way it comes
in first, and both ways store the same jsonb."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import orjson
import pytest

from evora.storage.jobs import JobStore
from evora.storage.schedules import ScheduleStore
from tests.api.conftest import ADMIN, PRODUCER, ApiClient

# JSON text as a client sends it: each is sent raw, never through a Python float.
PAYLOADS = [
    '{"big": 123456789012345678901234567890}',
    '{"big": -98765432109876543210}',
    '{"digits": 12345678901234567.89}',
    '{"exp": 1e2, "EXP": 1E-7, "tiny": 5e-324}',
    '{"zero": -0, "zerof": -0.0, "scale": 100.0, "tenth": 0.1}',
    '[1.000000000000000000001, 2.50, {"n": [3.14159265358979323846264338327950288]}]',
    "123456789012345678901234567890.5",
]


def exactly(text: bytes) -> Any:
    """JSON with its numbers as Decimals: equal when the numbers are, whatever their form."""
    return json.loads(text, parse_float=Decimal, parse_int=Decimal)


async def http_submit(client: ApiClient, body: str, status: int) -> dict[str, Any]:
    response = await client.post(
        "/v1/jobs",
        data=body.encode(),
        headers={**PRODUCER, "Content-Type": "application/json"},
    )
    assert response.status == status, await response.text()
    answer: dict[str, Any] = await response.json()
    return answer


async def sql_submit(db: asyncpg.Connection, payload: str, options: str) -> uuid.UUID:
    job_id: uuid.UUID = await db.fetchval(
        "SELECT evora.submit('exact', 'numbers', $1::text::jsonb, $2::text::jsonb)",
        payload,
        options,
    )
    return job_id


@pytest.mark.parametrize("payload", PAYLOADS)
async def test_payload_numbers_are_kept_exactly_both_ways(
    client: ApiClient, db: asyncpg.Connection, payload: str
) -> None:
    for first in ("http", "sql"):
        key = f"{first}-first"
        body = f'{{"queue": "exact", "type": "numbers", "idempotency_key": "{key}", '
        body += f'"payload": {payload}}}'
        options = orjson.dumps({"idempotency_key": key}).decode()
        if first == "http":
            job_id = uuid.UUID((await http_submit(client, body, 201))["id"])
            assert await sql_submit(db, payload, options) == job_id
        else:
            job_id = await sql_submit(db, payload, options)
            assert (await http_submit(client, body, 200))["id"] == str(job_id)
        stored, exact = await db.fetchrow(
            "SELECT payload::text, $2::jsonb::text FROM evora.jobs WHERE id = $1", job_id, payload
        )
        assert stored == exact, first
    assert await db.fetchval("SELECT count(*) FROM evora.jobs") == 2


@pytest.mark.parametrize("priority", ["1e2", "100.0", "1.0E2", "100"])
async def test_integer_fields_take_the_same_numbers_both_ways(
    client: ApiClient, db: asyncpg.Connection, priority: str
) -> None:
    fields = f'"priority": {priority}, "max_attempts": 3.0e0, "lease_seconds": 6e1'
    body = f'{{"queue": "exact", "type": "numbers", "idempotency_key": "k", {fields}}}'
    job = await http_submit(client, body, 201)
    assert (job["priority"], job["max_attempts"], job["lease_seconds"]) == (100, 3, 60)
    options = f'{{"idempotency_key": "k", {fields}}}'
    assert await sql_submit(db, "{}", options) == uuid.UUID(job["id"])


@pytest.mark.parametrize("priority", ["100.5", "1e-1", "1e5"])
async def test_integer_fields_refuse_the_same_numbers_both_ways(
    client: ApiClient, db: asyncpg.Connection, priority: str
) -> None:
    body = f'{{"queue": "exact", "type": "numbers", "priority": {priority}}}'
    await http_submit(client, body, 422)
    with pytest.raises(asyncpg.PostgresError) as refused:
        await sql_submit(db, "{}", f'{{"priority": {priority}}}')
    assert refused.value.sqlstate[:2] in ("22", "23") and "priority" in str(refused.value)


# Fractions beyond microseconds, rounded as PostgreSQL rounds them (ties included, and a
# carry into the next second, minute, day and year).
TIMESTAMPS = [
    "2030-01-01T00:00:00.1234567Z",
    "2030-01-01T00:00:00.1234565Z",
    "2030-01-01T00:00:00.0000005Z",
    "2030-01-01T00:00:00.0000015Z",
    "2030-01-01T00:00:00.00000049999Z",
    "2030-12-31T23:59:59.9999995Z",
    "2030-06-01T12:00:00.123456789012+02:00",
]


@pytest.mark.parametrize("run_at", TIMESTAMPS)
async def test_timestamps_round_alike_both_ways(
    client: ApiClient, db: asyncpg.Connection, run_at: str
) -> None:
    fields = f'"idempotency_key": "t", "run_at": "{run_at}", "expires_at": "{run_at}"'
    body = f'{{"queue": "exact", "type": "numbers", {fields}}}'
    job = await http_submit(client, body, 201)
    assert await sql_submit(db, "{}", f"{{{fields}}}") == uuid.UUID(job["id"])
    stored, rounded = await db.fetchrow(
        "SELECT run_at, $2::text::timestamptz FROM evora.jobs WHERE id = $1",
        uuid.UUID(job["id"]),
        run_at,
    )
    assert stored == rounded


async def test_racing_http_and_sql_submissions_of_one_key_make_one_job(
    client: ApiClient, pool: asyncpg.Pool
) -> None:
    """The same keyed submission, with numbers a float would change, sent at once over HTTP
    and in SQL (autocommit statements on several connections): one job, every caller gets
    it, none a conflict."""
    payload = '{"digits": 12345678901234567.89, "big": 98765432109876543210987, "e": 1E2}'
    body = (
        f'{{"queue": "exact", "type": "numbers", "idempotency_key": "race", "payload": {payload}}}'
    )
    options = '{"idempotency_key": "race"}'

    async def over_http() -> str:
        response = await client.post(
            "/v1/jobs", data=body.encode(), headers={**PRODUCER, "Content-Type": "application/json"}
        )
        assert response.status in (200, 201), await response.text()
        return str((await response.json())["id"])

    async def in_sql() -> str:
        return str(
            await pool.fetchval(
                "SELECT evora.submit('exact', 'numbers', $1::text::jsonb, $2::text::jsonb)",
                payload,
                options,
            )
        )

    ids = await asyncio.gather(*(f() for _ in range(6) for f in (over_http, in_sql)))
    assert len(set(ids)) == 1
    assert await pool.fetchval("SELECT count(*) FROM evora.jobs") == 1


# The midpoint between the largest double and 2**1024: from it on, a number rounds to
# infinity as a double, and both ways in refuse it.
BEYOND_A_DOUBLE = 2**1024 - 2**970


@pytest.mark.parametrize(
    "number",
    [str(BEYOND_A_DOUBLE), f"-{BEYOND_A_DOUBLE}", "1e400", "-1.5E+309", f"{BEYOND_A_DOUBLE}.0"],
)
async def test_numbers_beyond_a_double_are_refused_both_ways(
    client: ApiClient, db: asyncpg.Connection, number: str
) -> None:
    payload = f'{{"n": [1, {{"deep": {number}}}]}}'
    await http_submit(client, f'{{"queue": "exact", "type": "t", "payload": {payload}}}', 422)
    with pytest.raises(asyncpg.PostgresError) as refused:
        await sql_submit(db, payload, "{}")
    assert refused.value.sqlstate[:2] in ("22", "23") and "payload" in str(refused.value)


async def test_the_largest_numbers_a_double_holds_are_taken_both_ways(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    payload = f'{{"n": [{BEYOND_A_DOUBLE - 1}, -1.7976931348623157e308]}}'
    await http_submit(client, f'{{"queue": "exact", "type": "t", "payload": {payload}}}', 201)
    await sql_submit(db, payload, "{}")


async def test_integers_beyond_64_bits_and_doubles_are_handed_out_exactly(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    """jsonb holds them; a read made a float of an integer beyond 64 bits, and failed (500)
    on a number beyond a double's range (1e400, which evora.submit accepted before it
    refused such numbers as the api does: a database may still hold one)."""
    payload = '{"big": 123456789012345678901234567890, "n": [-98765432109876543210], "x": 0.5}'
    for text in (payload, '{"huge": 1e400, "n": [-1E+400]}'):
        job_id = await sql_submit(db, "{}", "{}")
        await db.execute(
            "UPDATE evora.jobs SET payload = $2::text::jsonb WHERE id = $1", job_id, text
        )
        response = await client.get(f"/v1/jobs/{job_id}", headers=PRODUCER)
        assert response.status == 200, await response.text()
        assert exactly(await response.read())["payload"] == exactly(text.encode())


@pytest.mark.parametrize("payload", PAYLOADS)
async def test_payloads_are_read_back_and_handed_out_exactly(
    payload: str, client: ApiClient, db: asyncpg.Connection, store: JobStore
) -> None:
    """Every number as stored, more significant digits than a double keeps included
    (12345678901234567.89 was read back as 12345678901234568): in the job resource, and in
    what a claim hands a worker, as a dependency's result too."""
    job_id = await sql_submit(db, payload, "{}")
    response = await client.get(f"/v1/jobs/{job_id}", headers=PRODUCER)
    assert response.status == 200, await response.text()
    assert exactly(await response.read())["payload"] == exactly(payload.encode())
    (claimed,) = await store.claim(worker_id="w", queues=["exact"], max_jobs=1)
    assert exactly(orjson.dumps(claimed["payload"])) == exactly(payload.encode())
    await store.complete(job_id, claimed["lease_token"], orjson.Fragment(payload.encode()))
    child = await sql_submit(db, "{}", json.dumps({"depends_on": [str(job_id)]}))
    (handed,) = await store.claim(worker_id="w", queues=["exact"], max_jobs=1)
    assert handed["id"] == child
    results = orjson.dumps(handed["dependency_results"])
    assert exactly(results) == {str(job_id): exactly(payload.encode())}


async def test_a_schedule_makes_its_jobs_with_the_exact_payload(
    client: ApiClient, store: JobStore, pool: asyncpg.Pool
) -> None:
    payload = '{"digits": 12345678901234567.89, "tenth": 0.1000000000000000055511151231257827}'
    body = (
        f'{{"cron": "* * * * *", "job": {{"queue": "exact", "type": "t", "payload": {payload}}}}}'
    )
    response = await client.put(
        "/v1/schedules/exact",
        data=body.encode(),
        headers={**ADMIN, "Content-Type": "application/json"},
    )
    assert response.status == 201, await response.text()
    tick = datetime.fromisoformat((await response.json())["next_run_at"])
    stored, exact = await pool.fetchrow(
        "SELECT (job -> 'payload')::text, $1::text::jsonb::text FROM evora.schedules", payload
    )
    assert stored == exact
    fired = await ScheduleStore(pool, store).fire_due(tick + timedelta(seconds=1))
    assert fired is not None and len(fired.made) == 1
    stored, exact = await pool.fetchrow(
        "SELECT payload::text, $2::text::jsonb::text FROM evora.jobs WHERE id = $1",
        fired.made[0].job_id,
        payload,
    )
    assert stored == exact
