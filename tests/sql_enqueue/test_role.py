"""The role evora_producer: an application's role granted it can submit, and can do nothing
else of Evora's (read or change jobs and events, call the internal or retention functions,
or make its own objects stand in for Evora's)."""

from __future__ import annotations

import asyncpg
import pytest

from tests.sql_enqueue.conftest import MakeRole

FORBIDDEN = [
    "SELECT count(*) FROM evora.jobs",
    "SELECT count(*) FROM evora.job_events",
    "SELECT count(*) FROM evora.idempotency_keys",
    "UPDATE evora.jobs SET priority = 1",
    "DELETE FROM evora.jobs",
    "INSERT INTO evora.job_events (job_id, job_version, queue, type, event, to_state, attempt,"
    " at, job) SELECT id, 9, queue, type, 'x', state, 0, now(), NULL FROM evora.jobs",
    "DELETE FROM evora.job_events",
    "INSERT INTO evora.job_event_rows (job_id, job_version, queue, type, event, to_state,"
    " attempt, at, job) SELECT id, 9, queue, type, 'x', state, 0, now(), NULL FROM evora.jobs",
    "SELECT count(*) FROM evora.event_batches",
    "DELETE FROM evora.job_event_rows",
    "DELETE FROM evora.event_batches",
    "SELECT evora.drop_archived_events(0, 0, 1)",
    "SELECT * FROM evora.expired_event_partitions(0, false)",
    "SELECT * FROM evora.expired_event_tables(0, false)",
    "SELECT evora.make_event_partitions(60, 2)",
    "SELECT * FROM evora.store_submissions('{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', "
    "'{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}')",
    "SELECT evora.validated('{}', '')",
    "SELECT evora.validated_with_dependencies('{}', '')",
]


async def test_a_role_granted_evora_producer_submits_and_does_nothing_else(
    make_role: MakeRole, app_conn: asyncpg.Connection
) -> None:
    conn = await asyncpg.connect(await make_role("evora_producer"))
    try:
        async with conn.transaction():
            job_id = await conn.fetchval("SELECT evora.submit('mail', 'mail.send')")
            ids = await conn.fetchval(
                """SELECT evora.submit_batch('[{"queue": "mail", "type": "t"}]')"""
            )
        for statement in FORBIDDEN:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(statement)
    finally:
        await conn.close()
    stored = await app_conn.fetch("SELECT id FROM evora.jobs ORDER BY submit_seq")
    assert [r["id"] for r in stored] == [job_id, *ids]
    events = await app_conn.fetchval("SELECT count(*) FROM evora.job_events")
    assert events == 2


async def test_a_role_without_the_grant_cannot_submit(make_role: MakeRole) -> None:
    conn = await asyncpg.connect(await make_role())
    try:
        for statement in (
            "SELECT evora.submit('mail', 'mail.send')",
            """SELECT evora.submit_batch('[{"queue": "mail", "type": "t"}]')""",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(statement)
    finally:
        await conn.close()


async def test_the_callers_own_objects_cannot_stand_in_for_evoras(
    make_role: MakeRole, app_conn: asyncpg.Connection
) -> None:
    """Objects of the caller's in pg_temp (searched first unless placed last) or earlier in
    its search_path are not what the functions use."""
    conn = await asyncpg.connect(await make_role("evora_producer"))
    try:
        await conn.execute("CREATE TEMP TABLE jobs (id uuid)")
        await conn.execute("CREATE TEMP TABLE idempotency_keys (queue text, key text)")
        await conn.execute(
            "CREATE FUNCTION pg_temp.job_image(j anyelement) RETURNS int LANGUAGE sql AS 'SELECT 1'"
        )
        job_id = await conn.fetchval(
            """SELECT evora.submit('mail', 't', '{}', '{"idempotency_key": "k"}')"""
        )
        assert await conn.fetchval("SELECT count(*) FROM pg_temp.jobs") == 0
    finally:
        await conn.close()
    assert await app_conn.fetchval("SELECT count(*) FROM evora.jobs WHERE id = $1", job_id) == 1
    assert await app_conn.fetchval("SELECT count(*) FROM evora.idempotency_keys") == 1
