"""Admission control (docs/flow-control.md, "Admission"): a limit's `max_pending` bounds the
jobs holding its key that wait to run (PENDING or WAITING). A submission over it is refused
with 429 `queue_full`, stores nothing, and is counted; a batch is admitted whole or refused
whole; a replay of an admitted job is still answered; a claim frees room. On the real api
app and a real PostgreSQL, with producers in SQL and over HTTP racing for the last room."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import orjson
import pytest

from evora.config import Settings
from evora.domain.errors import QueueFull
from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import JobStore
from evora.storage.submissions import Submitted
from evora_services.api.routes import SUBMITS
from tests.api.conftest import ADMIN, PRODUCER, ApiClient, MakeClient, job, problem
from tests.polling import until

QUEUE = "emails"


async def limit(client: ApiClient, key: str, max_pending: int | None, **fields: Any) -> None:
    body = {"concurrency": None, "rate": None, "max_pending": max_pending, **fields}
    response = await client.put(f"/v1/limits/{key}", json=body, headers=ADMIN)
    assert response.status in (200, 201), await response.text()
    assert (await response.json())["max_pending"] == max_pending


async def submit(client: ApiClient, **fields: Any) -> Any:
    return await client.post("/v1/jobs", json=job(QUEUE, **fields), headers=PRODUCER)


async def stored(db: asyncpg.Connection, key: str | None = None) -> int:
    count: int = await db.fetchval(
        "SELECT count(*) FROM evora.jobs WHERE $1::text IS NULL OR $1 = ANY(limit_keys)", key
    )
    return count


async def refused_metric(client: ApiClient, queue: str = QUEUE) -> float:
    text = await (await client.get("/metrics")).text()
    line = f'evora_admission_refused_total{{queue="{queue}"}} '
    return next(
        (float(row.removeprefix(line)) for row in text.splitlines() if row.startswith(line)), 0.0
    )


async def test_a_submission_over_max_pending_is_refused_and_counted(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    await limit(client, f"queue:{QUEUE}", 2)
    for _ in range(2):
        assert (await submit(client)).status == 201
    response = await submit(client)
    body = await problem(response, 429, "queue_full")
    assert response.headers["Retry-After"] == "1"
    assert f"'queue:{QUEUE}'" in body["detail"] and "max_pending of 2" in body["detail"]
    assert await stored(db) == 2
    assert await refused_metric(client) == 1

    # The room is what GET /v1/limits/{key} answers, to ask before a large batch: a
    # producer may ask it.
    usage = await (await client.get(f"/v1/limits/queue:{QUEUE}", headers=PRODUCER)).json()
    assert (usage["max_pending"], usage["pending"], usage["room"]) == (2, 2, 0)


async def test_a_claim_frees_room_and_running_jobs_do_not_count(
    client: ApiClient, store: JobStore, db: asyncpg.Connection
) -> None:
    await limit(client, "tenant:*", 2)
    for _ in range(2):
        assert (await submit(client, limit_keys=["tenant:7"])).status == 201
    await problem(await submit(client, limit_keys=["tenant:7"]), 429, "queue_full")
    # each key under the prefix has its own room
    assert (await submit(client, limit_keys=["tenant:8"])).status == 201

    [claimed] = await store.claim(worker_id="w", queues=[QUEUE], max_jobs=1)
    assert "tenant:7" in claimed["limit_keys"] or "tenant:8" in claimed["limit_keys"]
    usage = await (await client.get("/v1/limits/tenant:7", headers=ADMIN)).json()
    freed = 1 if "tenant:7" in claimed["limit_keys"] else 0
    assert (usage["pending"], usage["room"]) == (2 - freed, freed)
    # a prefix limit's own key has no single room
    usage = await (await client.get("/v1/limits/tenant:*", headers=ADMIN)).json()
    assert (usage["pending"], usage["room"]) == (None, None)

    # a job waiting on a dependency counts; a claimed one (RUNNING) does not
    await limit(client, "k", 2)
    other = {"queue": "other", "type": "t", "limit_keys": ["k"]}
    assert (await client.post("/v1/jobs", json=other, headers=PRODUCER)).status == 201
    [running] = await store.claim(worker_id="w", queues=["other"], max_jobs=10)
    waiting = {**other, "depends_on": [str(running["id"])]}
    response = await client.post("/v1/jobs", json=waiting, headers=PRODUCER)
    assert (await response.json())["state"] == "WAITING"
    assert (await client.post("/v1/jobs", json=other, headers=PRODUCER)).status == 201
    response = await client.post("/v1/jobs", json=other, headers=PRODUCER)
    await problem(response, 429, "queue_full")
    assert await refused_metric(client, "other") == 1


async def test_a_batch_is_admitted_whole_or_refused_whole(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    await limit(client, "tenant:*", 3)
    for _ in range(2):
        assert (await submit(client, limit_keys=["tenant:a"])).status == 201

    # tenant:b has room, tenant:a has room for one, not two: nothing is stored
    over = [job(QUEUE, limit_keys=["tenant:b"])] + [job(QUEUE, limit_keys=["tenant:a"])] * 2
    response = await client.post("/v1/jobs/batch", json={"jobs": over}, headers=PRODUCER)
    body = await problem(response, 429, "queue_full")
    assert "'tenant:a'" in body["detail"] and response.headers["Retry-After"] == "1"
    assert (await stored(db, "tenant:a"), await stored(db, "tenant:b")) == (2, 0)
    assert await refused_metric(client) == 1

    fits = [job(QUEUE, limit_keys=["tenant:b"]), job(QUEUE, limit_keys=["tenant:a"])]
    response = await client.post("/v1/jobs/batch", json={"jobs": fits}, headers=PRODUCER)
    assert response.status == 200, await response.text()
    assert (await stored(db, "tenant:a"), await stored(db, "tenant:b")) == (3, 1)


async def test_a_replay_of_an_admitted_job_is_answered_when_the_key_is_full(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    await limit(client, f"queue:{QUEUE}", 2)
    first = await submit(client, idempotency_key="order-1")
    assert first.status == 201
    assert (await submit(client)).status == 201
    await problem(await submit(client, idempotency_key="order-2"), 429, "queue_full")

    retry = await submit(client, idempotency_key="order-1")
    assert retry.status == 200 and retry.headers["Idempotent-Replayed"] == "true"
    assert (await retry.json())["id"] == (await first.json())["id"]
    batch = [job(QUEUE, idempotency_key="order-1")]
    response = await client.post("/v1/jobs/batch", json={"jobs": batch}, headers=PRODUCER)
    assert response.status == 200 and (await response.json())["jobs"][0]["status"] == 200
    # a batch that replays one job and would create another is refused whole
    batch.append(job(QUEUE))
    response = await client.post("/v1/jobs/batch", json={"jobs": batch}, headers=PRODUCER)
    await problem(response, 429, "queue_full")
    # the refused key was not kept: it is free once there is room
    assert await db.fetchval("SELECT count(*) FROM evora.idempotency_keys") == 1
    assert await stored(db) == 2


async def test_coalesced_requests_one_refused_leave_the_others_stored(
    client: ApiClient, db: asyncpg.Connection
) -> None:
    await limit(client, "full", 1)
    assert (await submit(client, limit_keys=["full"])).status == 201
    subs = [
        JobSubmission.model_validate(job(QUEUE, limit_keys=keys, payload={"n": n}))
        for n, keys in enumerate([["free"], ["full"], ["free"], [], ["full", "free"]])
    ]
    # they reach the coalescer in one turn of the event loop: one statement, then split
    outcomes = await asyncio.gather(
        *(client.app[SUBMITS].submit((s, None)) for s in subs), return_exceptions=True
    )
    refused = [n for n, outcome in enumerate(outcomes) if isinstance(outcome, QueueFull)]
    assert refused == [1, 4]
    for n in (0, 2, 3):
        outcome = outcomes[n]
        assert isinstance(outcome, Submitted) and outcome.created
    assert await stored(db, "free") == 2 and await stored(db, "full") == 1


@pytest.mark.parametrize("room", [1, 5])
async def test_producers_in_sql_and_http_racing_for_the_last_room(
    client: ApiClient,
    make_client: MakeClient,
    settings: Settings,
    db_url: str,
    db: asyncpg.Connection,
    room: int,
) -> None:
    # two api processes (each its own pool and coalescer) and applications in SQL
    apis = [client, await make_client(settings)]
    await limit(client, "race", 10)
    for _ in range(10 - room):
        assert (await submit(client, limit_keys=["race"])).status == 201
    conns = [await asyncpg.connect(db_url) for _ in range(8)]
    refusals: list[tuple[str, str]] = []
    try:

        async def in_sql(conn: asyncpg.Connection) -> bool:
            try:
                await conn.fetchval(
                    "SELECT evora.submit($1, 't', '{}', $2::jsonb)",
                    QUEUE,
                    orjson.dumps({"limit_keys": ["race"]}).decode(),
                )
            except asyncpg.PostgresError as exc:
                refusals.append((exc.sqlstate, exc.detail))
                return False
            return True

        async def over_http(api: ApiClient) -> bool:
            response = await submit(api, limit_keys=["race"])
            assert response.status in (201, 429), await response.text()
            return bool(response.status == 201)

        async def batch_of_two(api: ApiClient) -> bool:
            batch = [job(QUEUE, limit_keys=["race"])] * 2
            response = await api.post("/v1/jobs/batch", json={"jobs": batch}, headers=PRODUCER)
            assert response.status in (200, 429), await response.text()
            return bool(response.status == 200)

        admitted = await asyncio.gather(
            *(in_sql(conn) for conn in conns),
            *(over_http(apis[n % 2]) for n in range(8)),
            *(batch_of_two(apis[n % 2]) for n in range(3)),
        )
    finally:
        for conn in conns:
            await conn.close()
    assert set(refusals) <= {("EV429", "race")}
    jobs_admitted = sum(admitted[:16]) + 2 * sum(admitted[16:])
    assert await stored(db, "race") == 10 - room + jobs_admitted
    assert 10 - room + jobs_admitted == 10  # every room taken, never more


async def test_an_application_holding_a_key_delays_only_that_keys_requests(
    client: ApiClient, db_url: str, db: asyncpg.Connection
) -> None:
    await limit(client, "held", 2)
    await limit(client, "free", 2)
    assert (await submit(client, limit_keys=["held"])).status == 201
    holder = await asyncpg.connect(db_url)
    try:
        held = holder.transaction()
        await held.start()
        # an application takes the last room of `held` in a transaction it keeps open
        await holder.fetchval(
            "SELECT evora.submit($1, 't', '{}', $2::jsonb)",
            QUEUE,
            orjson.dumps({"limit_keys": ["held"]}).decode(),
        )
        waiting = asyncio.create_task(submit(client, limit_keys=["held"]))
        # sent with it: its statement gives up on the lock, so this one is not held up
        other = await submit(client, limit_keys=["free"])
        assert other.status == 201 and not waiting.done()
        await until(
            lambda: db.fetchval(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)"
            ),
            "the held key's request to wait for its lock",
        )
        await held.commit()
        # then it counts the application's job: the key is full
        await problem(await waiting, 429, "queue_full")
    finally:
        await holder.close()
    assert await stored(db, "held") == 2


async def test_a_max_pending_alone_restricts_no_claim(client: ApiClient, store: JobStore) -> None:
    # with a concurrency limit elsewhere, claims take the limited path; a limit with only a
    # max_pending governs its key there without holding any of its jobs back
    await limit(client, "busy", None, concurrency=1)
    await limit(client, "k", 5)
    for _ in range(3):
        assert (await submit(client, limit_keys=["k"])).status == 201
    claimed = await store.claim(worker_id="w", queues=[QUEUE], max_jobs=10)
    assert len(claimed) == 3
