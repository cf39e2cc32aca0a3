"""Debounce and throttle by key over HTTP and in SQL (docs/flow-control.md, "Debounce and
throttle"): 201 for a new job, 200 with `"debounced": true` or `"throttled": true` for one a
key answered with; race-free with producers in SQL and over HTTP on one key, and with an
application or a claim holding the key's job in an open transaction."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import orjson
import pytest

from evora.config import Settings
from evora.storage import queries
from tests.api.conftest import PRODUCER, ApiClient, MakeClient, job, problem
from tests.polling import until

QUEUE = "edits"
DEBOUNCE = {"key": "doc:1", "delay_seconds": 60, "max_delay_seconds": 600}
THROTTLE = {"key": "t:1", "window_seconds": 60}


async def submit(client: ApiClient, **fields: Any) -> Any:
    return await client.post("/v1/jobs", json=job(QUEUE, **fields), headers=PRODUCER)


async def in_sql(conn: asyncpg.Connection, payload: Any, **options: Any) -> Any:
    return await conn.fetchval(
        "SELECT evora.submit($1, 't', $2::jsonb, $3::jsonb)",
        QUEUE,
        orjson.dumps(payload).decode(),
        orjson.dumps(options).decode(),
    )


async def stored(db: asyncpg.Connection) -> list[asyncpg.Record]:
    return list(await db.fetch("SELECT id, payload::text AS payload FROM evora.jobs"))


async def test_a_burst_of_edits_makes_one_job(client: ApiClient, db: asyncpg.Connection) -> None:
    first = await submit(client, payload={"v": 1}, debounce=DEBOUNCE)
    assert first.status == 201, await first.text()
    made = await first.json()
    assert "debounced" not in made
    second = await submit(client, payload={"v": 2}, debounce=DEBOUNCE)
    assert second.status == 200 and "Idempotent-Replayed" not in second.headers
    body = await second.json()
    assert (body["id"], body["payload"], body["debounced"]) == (made["id"], {"v": 2}, True)
    assert body["run_at"] >= made["run_at"]
    events = await (await client.get(f"/v1/jobs/{made['id']}/events", headers=PRODUCER)).json()
    assert [e["event"] for e in events["events"]] == ["submitted", "debounced"]
    assert len(await stored(db)) == 1


async def test_throttle_answers_with_the_windows_job(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    first = await submit(client, throttle=THROTTLE)
    assert first.status == 201
    again = await submit(client, payload={"other": True}, throttle=THROTTLE)
    assert again.status == 200
    body = await again.json()
    assert (body["id"], body["throttled"], body["payload"]) == (
        (await first.json())["id"],
        True,
        {},
    )
    assert len(await stored(db)) == 1


@pytest.mark.parametrize(
    ("fields", "problem_field"),
    [
        ({"debounce": DEBOUNCE, "idempotency_key": "k"}, "idempotency_key"),
        ({"throttle": THROTTLE, "idempotency_key": "k"}, "idempotency_key"),
        ({"debounce": DEBOUNCE, "throttle": THROTTLE}, "throttle"),
        ({"debounce": DEBOUNCE, "delay_seconds": 1}, "debounce"),
        ({"debounce": {**DEBOUNCE, "max_delay_seconds": 1}}, "max_delay_seconds"),
        ({"throttle": {**THROTTLE, "window_seconds": 0}}, "window_seconds"),
        ({"debounce": DEBOUNCE, "ref": "a"}, "ref"),
    ],
)
async def test_combinations_a_key_cannot_keep_are_refused_in_http_and_sql(
    client: ApiClient, db: asyncpg.Connection, fields: dict[str, Any], problem_field: str
) -> None:
    body = await problem(await submit(client, **fields), 422, "validation_error")
    assert problem_field in orjson.dumps(body).decode()
    with pytest.raises(asyncpg.InvalidParameterValueError, match=problem_field):
        await in_sql(db, {}, **fields)
    assert await stored(db) == []


async def test_producers_in_sql_and_http_on_one_key_make_one_job(
    client: ApiClient,
    make_client: MakeClient,
    settings: Settings,
    db_url: str,
    db: asyncpg.Connection,
) -> None:
    # two api processes (each its own pool and coalescer) and applications in SQL, all at
    # once on one debounce key, then on one throttle key
    apis = [client, await make_client(settings)]
    conns = [await asyncpg.connect(db_url) for _ in range(6)]
    try:

        async def over_http(api: ApiClient, n: int, **fields: Any) -> str:
            response = await submit(api, payload={"n": n}, **fields)
            assert response.status in (200, 201), await response.text()
            return str((await response.json())["id"])

        async def batch_over_http(api: ApiClient, n: int, **fields: Any) -> set[str]:
            items = [job(QUEUE, payload={"n": n + k}, **fields) for k in (0, 1)]
            response = await api.post("/v1/jobs/batch", json={"jobs": items}, headers=PRODUCER)
            assert response.status == 200, await response.text()
            return {str(item["job"]["id"]) for item in (await response.json())["jobs"]}

        async def sql(conn: asyncpg.Connection, n: int, **fields: Any) -> str:
            return str(await in_sql(conn, {"n": n}, **fields))

        for fields in ({"debounce": DEBOUNCE}, {"throttle": THROTTLE}):
            answers = await asyncio.gather(
                *(sql(conn, n, **fields) for n, conn in enumerate(conns)),
                *(over_http(apis[n % 2], 100 + n, **fields) for n in range(8)),
                *(batch_over_http(apis[n % 2], 200 + 10 * n, **fields) for n in range(3)),
            )
            ids = set().union(*(a if isinstance(a, set) else {a} for a in answers))
            assert len(ids) == 1, ids
        rows = await stored(db)
        assert len(rows) == 2  # one per key
    finally:
        for conn in conns:
            await conn.close()
    [debounced] = [
        r
        for r in rows
        if await db.fetchval(
            "SELECT kind = 'debounce' FROM evora.submission_keys WHERE job_id = $1", r["id"]
        )
    ]
    # the payload of one of the submissions, the one the last debounced event wrote
    sent = {n for n in range(6)} | {100 + n for n in range(8)} | {200 + k for k in range(22)}
    assert orjson.loads(debounced["payload"])["n"] in sent
    last = await db.fetchval(
        "SELECT (job).version FROM evora.job_events WHERE job_id = $1 ORDER BY seq DESC LIMIT 1",
        debounced["id"],
    )
    assert last == await db.fetchval(
        "SELECT version FROM evora.jobs WHERE id = $1", debounced["id"]
    )


async def test_an_application_holding_the_key_makes_the_next_submission_wait(
    client: ApiClient, db_url: str, db: asyncpg.Connection
) -> None:
    holder = await asyncpg.connect(db_url)
    try:
        held = holder.transaction()
        await held.start()
        # an application submits with the key in a transaction it keeps open: its job is
        # not visible yet, but its key's lock is held
        made = await in_sql(holder, {"v": "application"}, debounce=DEBOUNCE)
        waiting = asyncio.create_task(submit(client, payload={"v": "http"}, debounce=DEBOUNCE))
        await until(
            lambda: db.fetchval(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)"
            ),
            "the second submission to wait for the key's lock",
        )
        assert not waiting.done()
        await held.commit()
        # then it finds the application's job and is absorbed by it: no duplicate
        response = await waiting
        assert response.status == 200, await response.text()
        body = await response.json()
        assert (body["id"], body["payload"], body["debounced"]) == (str(made), {"v": "http"}, True)
    finally:
        await holder.close()
    assert [r["id"] for r in await stored(db)] == [made]


async def test_a_claim_holding_the_job_wins_and_a_new_job_is_made(
    client: ApiClient, db_url: str, db: asyncpg.Connection
) -> None:
    due = {**DEBOUNCE, "delay_seconds": 0}
    first = await (await submit(client, payload={"v": 1}, debounce=due)).json()
    claimer = await asyncpg.connect(db_url)
    try:
        claim = claimer.transaction()
        await claim.start()
        # a claim has taken the job and not committed yet
        [claimed] = await claimer.fetch(queries.CLAIM, [QUEUE], None, 1, "w")
        assert str(claimed["job"]["id"]) == first["id"]
        waiting = asyncio.create_task(submit(client, payload={"v": 2}, debounce=due))
        await until(
            lambda: db.fetchval(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'transactionid' "
                "AND NOT granted)"
            ),
            "the submission to wait for the claimed job's row",
        )
        await claim.commit()
        # the started job keeps its payload; the submission made a job of its own
        response = await waiting
        assert response.status == 201, await response.text()
        assert (await response.json())["id"] != first["id"]
    finally:
        await claimer.close()
    payloads = {r["id"]: orjson.loads(r["payload"]) for r in await stored(db)}
    assert len(payloads) == 2 and {"v": 1} in payloads.values() and {"v": 2} in payloads.values()


async def test_in_sql_a_batch_repeating_a_key_answers_one_id_and_repeatable_read_is_refused(
    db: asyncpg.Connection,
) -> None:
    items = [job(QUEUE, payload={"n": n}, debounce=DEBOUNCE) for n in range(3)]
    ids = await db.fetchval("SELECT evora.submit_batch($1::jsonb)", orjson.dumps(items).decode())
    assert len(set(ids)) == 1
    assert [orjson.loads(r["payload"]) for r in await stored(db)] == [{"n": 2}]
    # the key's job is read under a snapshot taken after its lock: not the transaction's first
    with pytest.raises(asyncpg.FeatureNotSupportedError, match="READ COMMITTED"):
        async with db.transaction(isolation="repeatable_read"):
            await in_sql(db, {"n": 3}, debounce=DEBOUNCE)
    assert [orjson.loads(r["payload"]) for r in await stored(db)] == [{"n": 2}]


async def test_a_call_waiting_for_the_keys_job_as_a_dependency_does_not_deadlock(
    db_url: str, db: asyncpg.Connection
) -> None:
    # The key's job is also a dependency of other items submitted with the key: a call
    # that locked the job as a dependency and then waited for the key's lock, while the
    # key's holder waited to update the job, was a deadlock. Autocommit statements only.
    made = await in_sql(db, {"n": 0}, debounce=DEBOUNCE)
    conns = [await asyncpg.connect(db_url) for _ in range(8)]
    pair = [job(QUEUE, depends_on=[str(made)]), job(QUEUE, payload={"n": 1}, debounce=DEBOUNCE)]
    try:

        async def rounds(conn: asyncpg.Connection, n: int) -> None:
            for _ in range(15):
                if n % 2:
                    await conn.fetchval(
                        "SELECT evora.submit_batch($1::jsonb)", orjson.dumps(pair).decode()
                    )
                else:
                    await in_sql(conn, {"n": 2}, debounce=DEBOUNCE)

        await asyncio.gather(*(rounds(conn, n) for n, conn in enumerate(conns)))
    finally:
        for conn in conns:
            await conn.close()
    # every debounced submission went to the one job; each batch's other item waits for it
    assert await db.fetchval("SELECT count(*) FROM evora.jobs WHERE state = 'PENDING'") == 1
    assert await db.fetchval("SELECT count(*) FROM evora.jobs WHERE state = 'WAITING'") == 4 * 15
