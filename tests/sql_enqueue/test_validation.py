"""evora.submit and evora.submit_batch refuse what POST /v1/jobs refuses: SQLSTATE class 22
or 23, the message starting with the field; and accept what it accepts. Each case is also
put to the api's own submission model, so the two validations cannot drift apart."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import orjson
import pytest
from pydantic import ValidationError

from evora.protocol.jobs import JobSubmission
from evora.storage.rows import job_from_row

BASE: dict[str, Any] = {"queue": "emails", "type": "email.send"}

# (the fields that differ from BASE, the field the error must name)
INVALID: list[tuple[dict[str, Any], str]] = [
    ({"queue": "-starts-with-a-dash"}, "queue"),
    ({"queue": "q" * 129}, "queue"),
    ({"queue": "has space"}, "queue"),
    ({"queue": "line\n"}, "queue"),
    ({"queue": 7}, "queue"),
    ({"queue": None}, "queue"),
    ({"type": ""}, "type"),
    ({"type": "t" * 256}, "type"),
    ({"type": "a/b"}, "type"),
    ({"payload": {"blob": "x" * 1_048_576}}, "payload"),
    ({"priority": 32768}, "priority"),
    ({"priority": -32769}, "priority"),
    ({"priority": 1.5}, "priority"),
    ({"priority": "1"}, "priority"),
    ({"priority": True}, "priority"),
    ({"priority": None}, "priority"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": 1001}, "max_attempts"),
    ({"lease_seconds": 0}, "lease_seconds"),
    ({"lease_seconds": 86401}, "lease_seconds"),
    ({"max_duration_seconds": 0}, "max_duration_seconds"),
    ({"max_duration_seconds": 1.5}, "max_duration_seconds"),
    ({"max_duration_seconds": 315_360_001}, "max_duration_seconds"),
    ({"max_duration_seconds": "60"}, "max_duration_seconds"),
    ({"delay_seconds": -1}, "delay_seconds"),
    ({"delay_seconds": 315_360_001}, "delay_seconds"),
    ({"delay_seconds": "5"}, "delay_seconds"),
    ({"delay_seconds": 5, "run_at": "2030-01-01T00:00:00Z"}, "delay_seconds"),
    ({"run_at": "2030-01-01T00:00:00"}, "run_at"),
    ({"run_at": "tomorrow"}, "run_at"),
    ({"run_at": "2030-02-30T00:00:00Z"}, "run_at"),
    ({"run_at": "0001-01-01T00:00:00+01:00"}, "run_at"),
    ({"run_at": 1893456000}, "run_at"),
    ({"expires_at": "2030-01-01"}, "expires_at"),
    ({"backoff": {"initial_seconds": 0}}, "backoff.initial_seconds"),
    ({"backoff": {"initial_seconds": 10, "max_seconds": 5}}, "backoff.max_seconds"),
    ({"backoff": {"max_seconds": 0.5}}, "backoff.max_seconds"),
    ({"backoff": {"multiplier": 0.5}}, "backoff.multiplier"),
    ({"backoff": {"multiplier": 1001}}, "backoff.multiplier"),
    ({"backoff": {"jitter": 1}}, "backoff.jitter"),
    ({"backoff": None}, "backoff"),
    ({"backoff": 3}, "backoff"),
    ({"idempotency_key": ""}, "idempotency_key"),
    ({"idempotency_key": "k" * 256}, "idempotency_key"),
    ({"idempotency_key": 5}, "idempotency_key"),
    ({"group_key": ""}, "group_key"),
    ({"group_key": ["a"]}, "group_key"),
    ({"limit_keys": "tenant:1"}, "limit_keys"),
    ({"limit_keys": [f"k{n}" for n in range(9)]}, "limit_keys"),
    ({"limit_keys": ["a", "a"]}, "limit_keys"),
    ({"limit_keys": ["ok", "tenant:*"]}, "limit_keys.1"),
    ({"limit_keys": ["x" * 256]}, "limit_keys.0"),
    ({"limit_keys": [7]}, "limit_keys.0"),
    ({"colour": "red"}, "colour"),
    ({"debounce": {"key": "k", "delay_seconds": 1}}, "debounce.max_delay_seconds"),
    ({"debounce": {"key": "k", "delay_seconds": 1, "max_delay_seconds": 1, "x": 1}}, "debounce.x"),
    ({"debounce": {"key": "", "delay_seconds": 1, "max_delay_seconds": 1}}, "debounce.key"),
    (
        {"debounce": {"key": "k", "delay_seconds": -1, "max_delay_seconds": 1}},
        "debounce.delay_seconds",
    ),
    (
        {"debounce": {"key": "k", "delay_seconds": 0, "max_delay_seconds": 0}},
        "debounce.max_delay_seconds",
    ),
    ({"throttle": {"key": "k", "window_seconds": 0}}, "throttle.window_seconds"),
    ({"throttle": {"key": 7, "window_seconds": 1}}, "throttle.key"),
    ({"throttle": 3}, "throttle"),
    ({"depends_on": "01a20c32-9f79-79ab-93cf-bdbd9eb5bbfa"}, "depends_on"),
    ({"depends_on": {"a": 1}}, "depends_on"),
    ({"depends_on": [str(uuid.UUID(int=n)) for n in range(1, 1002)]}, "depends_on"),
    ({"depends_on": None}, "depends_on"),
    ({"on_dependency_failure": None}, "on_dependency_failure"),
    ({"on_dependency_failure": "maybe"}, "on_dependency_failure"),
    ({"on_dependency_failure": 1}, "on_dependency_failure"),
    ({"ref": ""}, "ref"),
    ({"ref": "a b"}, "ref"),
    ({"ref": 7}, "ref"),
]

VALID: list[dict[str, Any]] = [
    {},
    {"payload": None},
    {"payload": [1, "two", {"three": 3.5}]},
    {"payload": "x" * 1000},
    {"queue": "Q" + "q" * 127, "type": "t" * 255},
    {"queue": "a.b:c-d_e", "type": "_.:-"},
    {"priority": -32768, "max_attempts": 1000, "lease_seconds": 86400},
    {"priority": 32767, "max_attempts": 1, "lease_seconds": 1},
    {"delay_seconds": 0},
    {"delay_seconds": 2.5, "run_at": None},
    {"run_at": "2030-01-01T00:00:00+05:30", "expires_at": "2031-01-01T00:00:00.123456Z"},
    {"run_at": None, "expires_at": None, "idempotency_key": None, "group_key": None},
    {"backoff": {}},
    {"backoff": {"initial_seconds": 0.001, "max_seconds": 0.001, "multiplier": 1}},
    {"backoff": {"initial_seconds": 5, "max_seconds": 315_360_000, "multiplier": 1000}},
    {"idempotency_key": "k" * 255, "group_key": "g" * 255},
    {"idempotency_key": "ключ ✓", "group_key": " "},
    {"limit_keys": []},
    {"limit_keys": ["tenant:42", "api:stripe", "x" * 255, *[f"k{n}" for n in range(5)]]},
    {"limit_keys": ["b", "a"], "idempotency_key": "limited"},
    {"depends_on": [], "on_dependency_failure": "run"},
    {"on_dependency_failure": "cancel", "ref": None},
    {"max_duration_seconds": 1},
    {"max_duration_seconds": 315_360_000, "idempotency_key": "limited in time"},
    {"max_duration_seconds": None},
]


def _model_error_fields(item: dict[str, Any]) -> set[str]:
    try:
        JobSubmission.model_validate_json(orjson.dumps(item))
    except ValidationError as exc:
        return {".".join(str(p) for p in e["loc"]) for e in exc.errors()}
    return set()


def _options(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in ("queue", "type", "payload")}


async def _submit(conn: asyncpg.Connection, item: dict[str, Any]) -> Any:
    return await conn.fetchval(
        "SELECT evora.submit($1::text::jsonb #>> '{}', $2::text::jsonb #>> '{}', "
        "$3::text::jsonb, $4::text::jsonb)",
        orjson.dumps(item.get("queue")).decode(),
        orjson.dumps(item.get("type")).decode(),
        orjson.dumps(item.get("payload", {})).decode(),
        orjson.dumps(_options(item)).decode(),
    )


async def _submit_batch(conn: asyncpg.Connection, items: list[dict[str, Any]]) -> Any:
    return await conn.fetchval(
        "SELECT evora.submit_batch($1::text::jsonb)", orjson.dumps(items).decode()
    )


@pytest.mark.parametrize(("change", "field"), INVALID, ids=[f for _, f in INVALID])
async def test_an_invalid_submission_is_refused_naming_its_field(
    app_conn: asyncpg.Connection, change: dict[str, Any], field: str
) -> None:
    item = {**BASE, **change}
    assert any(f == field or f.startswith(f"{field}.") for f in _model_error_fields(item)) or (
        # the model names the whole object for a rule between two of its fields
        field in ("backoff.max_seconds", "delay_seconds") and _model_error_fields(item)
    ), "the api's model must refuse it too"
    in_batch = [BASE, item]
    with pytest.raises(asyncpg.PostgresError) as raised:
        await _submit_batch(app_conn, in_batch)
    assert str(raised.value.sqlstate)[:2] in ("22", "23"), raised.value
    assert str(raised.value).startswith(f"jobs[1].{field}:"), raised.value
    # Arguments of their own (queue, type) are SQL text: a JSON number or null cannot be
    # passed as one, and a SQL NULL is refused as missing.
    if not isinstance(change.get("queue", ""), str) or not isinstance(change.get("type", ""), str):
        return
    with pytest.raises(asyncpg.PostgresError) as raised:
        await _submit(app_conn, item)
    assert str(raised.value.sqlstate)[:2] in ("22", "23"), raised.value
    assert str(raised.value).startswith(f"{field}:"), raised.value
    assert await app_conn.fetchval("SELECT count(*) FROM evora.jobs") == 0


@pytest.mark.parametrize("change", VALID, ids=[str(i) for i in range(len(VALID))])
async def test_a_valid_submission_is_accepted(
    app_conn: asyncpg.Connection, change: dict[str, Any]
) -> None:
    item = {**BASE, **change}
    assert _model_error_fields(item) == set(), "the api's model must accept it too"
    job_id = await _submit(app_conn, item)
    batch_ids = await _submit_batch(app_conn, [item, item])
    model = JobSubmission.model_validate_json(orjson.dumps(item))
    ids = [job_id, *batch_ids]
    rows = await app_conn.fetch("SELECT * FROM evora.jobs WHERE id = ANY($1::uuid[])", ids)
    # the same key and fields: one job, replayed
    assert len(rows) == len(set(ids)) == (1 if model.idempotency_key else 3)
    for row in rows:
        assert (row["queue"], row["type"], row["priority"]) == (
            model.queue,
            model.type,
            model.priority,
        )
        assert orjson.loads(row["payload"]) == model.payload
        assert (row["max_attempts"], row["lease_seconds"]) == (
            model.max_attempts,
            model.lease_seconds,
        )
        # (a default field is stored as NULL: migration 0067; the job reads it back)
        assert job_from_row(row)["backoff"] == model.backoff.model_dump()
        assert (row["expires_at"], row["idempotency_key"], row["group_key"]) == (
            model.expires_at,
            model.idempotency_key,
            model.group_key,
        )
        assert row["limit_keys"] == model.limit_keys
        assert row["max_duration_seconds"] == model.max_duration_seconds
        if model.run_at is not None:
            assert row["run_at"] == model.run_at


@pytest.mark.parametrize(
    ("call", "field"),
    [
        ("SELECT evora.submit(NULL, 't')", "queue"),
        ("SELECT evora.submit('q', NULL)", "type"),
        ("SELECT evora.submit('q', 't', NULL)", "payload"),
        ("SELECT evora.submit('q', 't', '{}', '[]')", "options"),
        ("SELECT evora.submit('q', 't', '{}', NULL)", "options"),
        ("""SELECT evora.submit('q', 't', '{}', '{"queue": "other"}')""", "options.queue"),
        ("""SELECT evora.submit('q', 't', '{}', '{"payload": 1}')""", "options.payload"),
        ("SELECT evora.submit_batch('[]')", "jobs"),
        ("SELECT evora.submit_batch('{}')", "jobs"),
        ("SELECT evora.submit_batch(NULL)", "jobs"),
        ("""SELECT evora.submit_batch('[{"queue": "q", "type": "t"}, 5]')""", "jobs[1]"),
        (
            "SELECT evora.submit_batch((SELECT jsonb_agg(jsonb_build_object('queue', 'q', "
            "'type', 't')) FROM generate_series(1, 1001)))",
            "jobs",
        ),
    ],
)
async def test_arguments_of_the_functions_are_checked(
    app_conn: asyncpg.Connection, call: str, field: str
) -> None:
    with pytest.raises(asyncpg.PostgresError) as raised:
        await app_conn.execute(call)
    assert str(raised.value.sqlstate)[:2] in ("22", "23"), raised.value
    assert str(raised.value).startswith(f"{field}:"), raised.value


async def test_a_batch_of_the_largest_size_is_accepted(app_conn: asyncpg.Connection) -> None:
    ids = await _submit_batch(app_conn, [BASE] * 1000)
    assert len(set(ids)) == 1000
    assert await app_conn.fetchval("SELECT count(*) FROM evora.jobs") == 1000
