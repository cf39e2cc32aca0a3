"""Dependencies submitted in SQL (evora.submit, evora.submit_batch and the evora.sql_enqueue
helpers): depends_on, on_dependency_failure and refs as over HTTP, with the same refusals
naming the field, in the caller's transaction."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import pytest

from evora import sql_enqueue as sql
from evora.storage import queries


async def _states(conn: asyncpg.Connection, ids: list[uuid.UUID]) -> list[str]:
    rows = await conn.fetch(
        "SELECT state::text FROM evora.jobs j JOIN unnest($1::uuid[]) WITH ORDINALITY u(id, n) "
        "ON u.id = j.id ORDER BY u.n",
        ids,
    )
    return [r["state"] for r in rows]


async def _depends_on(conn: asyncpg.Connection, job_id: uuid.UUID) -> list[uuid.UUID]:
    return list(
        await conn.fetchval("SELECT depends_on FROM evora.jobs WHERE id = $1", job_id) or []
    )


async def test_a_batch_with_refs_and_a_dependent_submission_store_the_graph(
    app_conn: asyncpg.Connection,
) -> None:
    async with app_conn.transaction():
        a, b, c = await sql.submit_batch(
            app_conn,
            [
                {"queue": "q", "type": "t", "ref": "a"},
                {"queue": "q", "type": "t", "ref": "b", "depends_on": ["ref:a"]},
                {
                    "queue": "q",
                    "type": "t",
                    "depends_on": ["ref:a", "ref:b"],
                    "on_dependency_failure": "run",
                },
            ],
        )
        d = await sql.submit(app_conn, "q", "t", depends_on=[c, str(a).upper()])
    assert await _states(app_conn, [a, b, c, d]) == ["PENDING", "WAITING", "WAITING", "WAITING"]
    assert await _depends_on(app_conn, c) == [a, b]
    assert await _depends_on(app_conn, d) == [c, a]
    assert (
        await app_conn.fetchval("SELECT on_dependency_failure FROM evora.jobs WHERE id = $1", c)
        == "run"
    )
    edges = await app_conn.fetchval("SELECT count(*) FROM evora.job_dependencies")
    assert edges == 5


async def test_a_dependency_completed_already_leaves_the_job_pending(
    app_conn: asyncpg.Connection,
) -> None:
    a = await sql.submit(app_conn, "q", "t")
    # claimed and completed by the statements a worker's requests run, events and all
    [claimed] = await app_conn.fetch(queries.CLAIM, ["q"], None, 1, "w")
    await app_conn.fetch(queries.COMPLETE, [a], [claimed["job"]["lease_token"]], [None], [], False)
    b = await sql.submit(app_conn, "q", "t", depends_on=[a])
    assert await _states(app_conn, [b]) == ["PENDING"]


async def test_a_batch_sent_again_depends_on_the_job_its_key_replays(
    app_conn: asyncpg.Connection,
) -> None:
    batch: list[dict[str, Any]] = [
        {"queue": "q", "type": "t", "ref": "a", "idempotency_key": "k"},
        {"queue": "q", "type": "t", "depends_on": ["ref:a"]},
    ]
    a, _ = await sql.submit_batch(app_conn, batch)
    replayed, again = await sql.submit_batch(app_conn, batch)
    assert replayed == a
    assert await _depends_on(app_conn, again) == [a]


async def _cancelled(conn: asyncpg.Connection) -> uuid.UUID:
    job_id = await sql.submit(conn, "q", "t")
    await conn.fetch(queries.CANCEL, job_id, [])
    return job_id


MISSING = uuid.UUID(int=7)


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ({"depends_on": [str(MISSING)]}, f"jobs[1].depends_on[0]: {MISSING} names no job"),
        ({"depends_on": ["ref:later"]}, "jobs[1].depends_on[0]: 'ref:later' names no earlier"),
        ({"depends_on": ["ref:self"], "ref": "self"}, "jobs[1].depends_on[0]: 'ref:self'"),
        ({"ref": "first"}, "jobs[1].ref: 'first' is already the ref of an earlier item"),
        ({"depends_on": ["ref:first", "ref:first"]}, "jobs[1].depends_on[1]: names a job more"),
        ({"depends_on": ["nope"]}, 'jobs[1].depends_on[0]: must be a job id or "ref:<name>"'),
        ({"depends_on": [5]}, 'jobs[1].depends_on[0]: must be a job id or "ref:<name>"'),
        ({"depends_on": ["CANCELLED"]}, "jobs[1].depends_on[0]: {cancelled} names a CANCELLED"),
    ],
)
async def test_an_invalid_dependency_is_refused_naming_its_place(
    app_conn: asyncpg.Connection, second: dict[str, Any], message: str
) -> None:
    cancelled = await _cancelled(app_conn)
    if second.get("depends_on") == ["CANCELLED"]:
        second = {"depends_on": [str(cancelled)]}
    batch = [{"queue": "q", "type": "t", "ref": "first"}, {"queue": "q", "type": "t", **second}]
    with pytest.raises(asyncpg.InvalidParameterValueError) as raised:
        await sql.submit_batch(app_conn, batch)
    assert str(raised.value).startswith(message.format(cancelled=cancelled)), raised.value
    assert raised.value.column_name is not None
    assert raised.value.column_name.startswith("jobs[1].")
    assert await app_conn.fetchval("SELECT count(*) FROM evora.jobs") == 1  # the cancelled one


async def test_a_cancelled_dependency_is_accepted_when_the_job_runs_anyway(
    app_conn: asyncpg.Connection,
) -> None:
    cancelled = await _cancelled(app_conn)
    job_id = await sql.submit(
        app_conn, "q", "t", depends_on=[cancelled], on_dependency_failure="run"
    )
    assert await _states(app_conn, [job_id]) == ["PENDING"]
