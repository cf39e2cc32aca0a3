"""One idempotency key, submitted in SQL and over HTTP: the same rules, one job.

Same key and same fields replay the first job, whichever way either came in; other fields
are a conflict (SQLSTATE 23505, constraint evora_idempotency_conflict / 409
idempotency_conflict); a key whose job was removed stays spent (evora_idempotent_job_gone /
409 idempotent_job_gone). Racing submissions, in SQL and over HTTP, make exactly one job."""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage.retention import PRUNE_FINISHED
from tests.polling import until
from tests.servers import Service
from tests.sql_enqueue.conftest import PRODUCER

CLIENTS = 24
ROUNDS = 4

FULL: dict[str, Any] = {
    "queue": "orders",
    "type": "order.ship",
    "payload": {"order": 42, "items": [1, 2.5, "three"], "note": "ünïcode ✓"},
    "priority": -5,
    "run_at": "2030-06-01T12:00:00+02:00",
    "max_attempts": 7,
    "lease_seconds": 120,
    "backoff": {"initial_seconds": 2, "max_seconds": 60, "multiplier": 3},
    "expires_at": "2031-01-01T00:00:00Z",
    "group_key": "customer-7",
}


async def _sql_submit(conn: asyncpg.Connection, job: dict[str, Any]) -> uuid.UUID:
    options = {k: v for k, v in job.items() if k not in ("queue", "type", "payload")}
    job_id: uuid.UUID = await conn.fetchval(
        "SELECT evora.submit($1, $2, $3::text::jsonb, $4::text::jsonb)",
        job["queue"],
        job["type"],
        orjson.dumps(job.get("payload", {})).decode(),
        orjson.dumps(options).decode(),
    )
    return job_id


async def _http_submit(
    http: aiohttp.ClientSession, api: Service, job: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    async with http.post(api.url + "/v1/jobs", json=job, headers=PRODUCER) as response:
        return response.status, await response.json(content_type=None)


async def test_the_same_fields_replay_across_sql_and_http(
    app_conn: asyncpg.Connection, api: Service
) -> None:
    async with aiohttp.ClientSession() as http:
        first = {**FULL, "idempotency_key": "sql-first"}
        job_id = await _sql_submit(app_conn, first)
        status, body = await _http_submit(http, api, first)
        assert (status, body["id"]) == (200, str(job_id))
        # the same instant written with another offset is the same field
        same_instant = {**first, "run_at": "2030-06-01T10:00:00Z"}
        assert (await _http_submit(http, api, same_instant))[1]["id"] == str(job_id)

        http_first = {
            **FULL,
            "idempotency_key": "http-first",
            "delay_seconds": 30,
            "max_duration_seconds": 600,
        }
        del http_first["run_at"]
        status, body = await _http_submit(http, api, http_first)
        assert status == 201
        assert str(await _sql_submit(app_conn, http_first)) == body["id"]

        for change in (
            {"priority": -4},
            {"payload": {"order": 43}},
            {"delay_seconds": 31},
            {"max_duration_seconds": 601},
            {"max_duration_seconds": None},
        ):
            other = {**http_first, **change}
            status, problem = await _http_submit(http, api, other)
            assert (status, problem["code"]) == (409, "idempotency_conflict")
            with pytest.raises(asyncpg.UniqueViolationError) as raised:
                await _sql_submit(app_conn, other)
            assert raised.value.constraint_name == "evora_idempotency_conflict"
            assert str(raised.value).startswith("idempotency_key:")
        assert await app_conn.fetchval("SELECT count(*) FROM evora.jobs") == 2


async def test_a_key_whose_job_was_removed_stays_spent(
    app_conn: asyncpg.Connection, api: Service
) -> None:
    job = {"queue": "q", "type": "t", "idempotency_key": "spent"}
    job_id = await _sql_submit(app_conn, job)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{api.url}/v1/jobs/{job_id}/cancel", headers=PRODUCER) as response:
            assert response.status == 200
        # removed by retention's own statement, which counts what it removes
        assert await app_conn.fetchval(PRUNE_FINISHED, -1.0, 10, "CANCELLED") == 1
        status, problem = await _http_submit(http, api, job)
        assert (status, problem["code"]) == (409, "idempotent_job_gone")
    with pytest.raises(asyncpg.UniqueViolationError) as raised:
        await _sql_submit(app_conn, job)
    assert raised.value.constraint_name == "evora_idempotent_job_gone"
    with pytest.raises(asyncpg.UniqueViolationError) as raised:
        await app_conn.fetchval(
            "SELECT evora.submit_batch($1::text::jsonb)",
            orjson.dumps([{"queue": "q", "type": "t"}, job]).decode(),
        )
    assert str(raised.value).startswith("jobs[1].idempotency_key:")
    assert await app_conn.fetchval("SELECT count(*) FROM evora.jobs") == 0


async def test_a_repeated_key_in_one_sql_batch(app_conn: asyncpg.Connection) -> None:
    job = {"queue": "q", "type": "t", "idempotency_key": "twice"}
    ids = await app_conn.fetchval(
        "SELECT evora.submit_batch($1::text::jsonb)",
        orjson.dumps([job, {**job, "queue": "r"}, job]).decode(),
    )
    assert ids[0] == ids[2] != ids[1]
    with pytest.raises(asyncpg.UniqueViolationError) as raised:
        await app_conn.fetchval(
            "SELECT evora.submit_batch($1::text::jsonb)",
            orjson.dumps(
                [
                    {**job, "idempotency_key": "new"},
                    {**job, "idempotency_key": "new", "priority": 1},
                ]
            ).decode(),
        )
    assert str(raised.value) == (
        "jobs[1].idempotency_key: reuses the idempotency key of jobs[0] with different fields"
    )
    assert await app_conn.fetchval("SELECT count(*) FROM evora.jobs") == 2


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
async def test_an_http_submission_waits_for_an_open_sql_transaction_holding_its_key(
    db_url: str, app_conn: asyncpg.Connection, api: Service, commit: bool
) -> None:
    job = {"queue": "q", "type": "t", "idempotency_key": "held"}
    async with aiohttp.ClientSession() as http:
        tx = app_conn.transaction()
        await tx.start()
        held_id = await _sql_submit(app_conn, job)
        request = asyncio.create_task(_http_submit(http, api, job))
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND application_name LIKE 'evora%'"
        )
        monitor = await asyncpg.connect(db_url)
        try:

            async def api_waits() -> bool:
                return bool(await monitor.fetchval(waiting) == 1)

            await until(api_waits, "the api waiting for the key")
        finally:
            await monitor.close()
        await (tx.commit() if commit else tx.rollback())
        status, body = await asyncio.wait_for(request, 30)
    if commit:
        assert (status, body["id"]) == (200, str(held_id))
    else:
        assert status == 201
        assert body["id"] != str(held_id)
    assert await app_conn.fetchval("SELECT count(*) FROM evora.jobs") == 1


async def _racer(
    job: dict[str, Any],
    start: asyncio.Event,
    *,
    conn: asyncpg.Connection | None,
    http: aiohttp.ClientSession,
    api: Service,
    batch: bool,
) -> str:
    """One racing client: in SQL on `conn` (its own transaction) or over HTTP; the job id
    it was answered, or "conflict"."""
    await start.wait()
    if conn is not None:
        try:
            async with conn.transaction():
                if batch:
                    ids = await conn.fetchval(
                        "SELECT evora.submit_batch($1::text::jsonb)", orjson.dumps([job]).decode()
                    )
                    return str(ids[0])
                return str(await _sql_submit(conn, job))
        except asyncpg.UniqueViolationError as exc:
            return "conflict" if exc.constraint_name == "evora_idempotency_conflict" else str(exc)
    if batch:
        body = {"jobs": [job]}
        async with http.post(api.url + "/v1/jobs/batch", json=body, headers=PRODUCER) as response:
            answer = await response.json(content_type=None)
            if response.status == 200:
                return str(answer["jobs"][0]["job"]["id"])
            return "conflict" if answer.get("code") == "idempotency_conflict" else str(answer)
    status, answer = await _http_submit(http, api, job)
    if status in (200, 201):
        return str(answer["id"])
    return "conflict" if answer.get("code") == "idempotency_conflict" else str(answer)


async def _race(
    jobs: list[dict[str, Any]],
    conns: list[asyncpg.Connection],
    http: aiohttp.ClientSession,
    api: Service,
    rng: random.Random,
) -> list[str]:
    """Client n submits jobs[n], all released at once: every other client in SQL on its own
    connection, the rest over HTTP (about a third of those as a batch of one). Each one's
    answer, in order."""
    start = asyncio.Event()
    tasks = [
        asyncio.create_task(
            _racer(
                job,
                start,
                conn=conns[n // 2] if n % 2 == 0 else None,
                http=http,
                api=api,
                batch=rng.random() < 0.3,
            )
        )
        for n, job in enumerate(jobs)
    ]
    start.set()
    return list(await asyncio.gather(*tasks))


async def test_racing_sql_and_http_submissions_of_one_key_make_one_job(
    db_url: str, api: Service
) -> None:
    """Many clients at once, each in SQL (its own transaction) or over HTTP (single or
    batch), two thirds with one set of fields and a third with another: one job; every
    client with the winner's fields gets it, every other one a conflict."""
    rng = random.Random(17)
    conns = [await asyncpg.connect(db_url) for _ in range(CLIENTS // 2)]
    try:
        async with aiohttp.ClientSession() as http:
            for round_ in range(ROUNDS):
                key = f"race-{round_}"
                variants = [
                    {"queue": "race", "type": "t", "payload": {"v": v}, "idempotency_key": key}
                    for v in ("a", "b")
                ]
                chosen = [1 if n % 3 == 0 else 0 for n in range(CLIENTS)]
                answers = await _race([variants[c] for c in chosen], conns, http, api, rng)
                rows = await conns[0].fetch(
                    "SELECT id, payload FROM evora.jobs WHERE idempotency_key = $1", key
                )
                assert len(rows) == 1
                winner = 0 if orjson.loads(rows[0]["payload"]) == {"v": "a"} else 1
                expected = [str(rows[0]["id"]) if c == winner else "conflict" for c in chosen]
                assert answers == expected
    finally:
        for conn in conns:
            await conn.close()


async def _stored_before_0011(
    http: aiohttp.ClientSession, api: Service, conn: asyncpg.Connection, job: dict[str, Any]
) -> Any:
    """Submit `job` (its only keyed submission so far), then give its key the fingerprint
    the api stored before migration 0011: sha256 of the fields a submission had then, as
    sorted JSON. The job as answered."""
    status, body = await _http_submit(http, api, job)
    assert status == 201
    fields = JobSubmission.model_validate_json(orjson.dumps(job)).model_dump(
        mode="json",
        exclude={
            "idempotency_key",
            "depends_on",
            "on_dependency_failure",
            "ref",
            "limit_keys",
            "max_duration_seconds",
            "fairness_key",
            "debounce",
            "throttle",
        },
    )
    before = hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)).digest()
    await conn.execute("UPDATE evora.idempotency_keys SET fingerprint = $1", before)
    return body


async def test_a_key_stored_before_the_database_computed_fingerprints_still_replays(
    app_conn: asyncpg.Connection, api: Service
) -> None:
    """Before migration 0011 the api stored sha256 of the submission's fields as sorted JSON;
    a retry after the upgrade with the same fields is still a replay, other fields still a
    conflict."""
    job = {**FULL, "idempotency_key": "from-before"}
    async with aiohttp.ClientSession() as http:
        body = await _stored_before_0011(http, api, app_conn, job)
        status, replay = await _http_submit(http, api, job)
        assert (status, replay["id"]) == (200, body["id"])
        status, problem = await _http_submit(http, api, {**job, "priority": 0})
        assert (status, problem["code"]) == (409, "idempotency_conflict")


async def _conflict(conn: asyncpg.Connection, submit: Any) -> None:
    """`submit` raises the idempotency conflict and stores nothing."""
    stored = await conn.fetchval("SELECT count(*) FROM evora.jobs")
    with pytest.raises(asyncpg.UniqueViolationError) as raised:
        async with conn.transaction():
            await submit
    assert raised.value.constraint_name == "evora_idempotency_conflict"
    assert await conn.fetchval("SELECT count(*) FROM evora.jobs") == stored


async def test_dependencies_are_part_of_what_a_key_compares_in_sql(
    app_conn: asyncpg.Connection,
) -> None:
    a, b, c = [str(await _sql_submit(app_conn, {"queue": "p", "type": "t"})) for _ in range(3)]
    job = {"queue": "q", "type": "t", "idempotency_key": "deps", "depends_on": [a, b]}
    job_id = await _sql_submit(app_conn, job)
    assert await _sql_submit(app_conn, {**job, "depends_on": [b, a]}) == job_id
    changes: list[dict[str, Any]] = [
        {"depends_on": [a, c]},
        {"depends_on": [a]},
        {"depends_on": []},
        {"on_dependency_failure": "run"},
    ]
    for change in changes:
        await _conflict(app_conn, _sql_submit(app_conn, {**job, **change}))
    assert await app_conn.fetchval("SELECT count(*) FROM evora.job_dependencies") == 2


def _sql_batch(conn: asyncpg.Connection, items: list[dict[str, Any]]) -> Any:
    return conn.fetchval("SELECT evora.submit_batch($1::text::jsonb)", orjson.dumps(items).decode())


def _workflow(x: str, *, policy: str = "cancel", plain: int = 1) -> list[dict[str, Any]]:
    return [
        {"queue": "q", "type": "extract", "ref": "a", "idempotency_key": "wf:a"},
        {"queue": "q", "type": "extract", "ref": "plain", "payload": {"n": plain}},
        {
            "queue": "q",
            "type": "report",
            "idempotency_key": "wf:b",
            "depends_on": ["ref:a", "ref:plain", x],
            "on_dependency_failure": policy,
        },
    ]


async def test_a_batch_with_refs_sent_again_replays_in_sql_and_over_http(
    app_conn: asyncpg.Connection, api: Service
) -> None:
    """The refs of a batch sent again resolve to other ids (the replayed job, a new job for
    an item without a key), yet it is the same submission: whichever way each copy came in."""
    x = str(await _sql_submit(app_conn, {"queue": "p", "type": "t"}))
    a, plain, b = await _sql_batch(app_conn, _workflow(x))
    again = await _sql_batch(app_conn, _workflow(x))
    assert (again[0], again[2]) == (a, b) and again[1] != plain
    async with aiohttp.ClientSession() as http:
        body = {"jobs": _workflow(x)}
        async with http.post(api.url + "/v1/jobs/batch", json=body, headers=PRODUCER) as response:
            assert response.status == 200
            items = (await response.json())["jobs"]
        assert [item["status"] for item in items] == [200, 201, 200]
        assert items[2]["job"]["id"] == str(b)
        for other in (_workflow(x, policy="run"), _workflow(x, plain=2)):
            async with http.post(
                api.url + "/v1/jobs/batch", json={"jobs": other}, headers=PRODUCER
            ) as response:
                assert response.status == 409
                assert (await response.json(content_type=None))["code"] == "idempotency_conflict"
            await _conflict(app_conn, _sql_batch(app_conn, other))
    y = str(await _sql_submit(app_conn, {"queue": "p", "type": "t"}))
    other_job = _workflow(x)
    other_job[2] = {**other_job[2], "depends_on": ["ref:a", "ref:plain", y]}
    await _conflict(app_conn, _sql_batch(app_conn, other_job))


@pytest.mark.parametrize("added", ["depends_on", "limit_keys", "max_duration_seconds"])
async def test_a_key_stored_before_the_database_computed_fingerprints_refuses_later_fields(
    app_conn: asyncpg.Connection, api: Service, added: str
) -> None:
    """A submission made before migration 0011 could have no dependencies and no limit keys
    (both came later): one that has them is not its retry, even with every other field the
    same."""
    job = {**FULL, "idempotency_key": "old-no-deps"}
    parent = str(await _sql_submit(app_conn, {"queue": "p", "type": "t"}))
    later = {"depends_on": [parent], "limit_keys": ["tenant:acme"], "max_duration_seconds": 60}[
        added
    ]
    async with aiohttp.ClientSession() as http:
        await _stored_before_0011(http, api, app_conn, job)
        status, problem = await _http_submit(http, api, {**job, added: later})
        assert (status, problem["code"]) == (409, "idempotency_conflict")


async def test_racing_submissions_of_one_key_with_other_dependencies_make_one_job(
    db_url: str, app_conn: asyncpg.Connection, api: Service
) -> None:
    """Clients in SQL and over HTTP race one key with one of four sets of dependencies, two
    of them the same jobs in another order: one job; the clients whose dependencies are the
    winner's get it, every other one a conflict."""
    rng = random.Random(23)
    a, b, c = [str(await _sql_submit(app_conn, {"queue": "p", "type": "t"})) for _ in range(3)]
    variants: list[dict[str, Any]] = [
        {"depends_on": [a, b]},
        {"depends_on": [b, a]},
        {"depends_on": [a, c]},
        {"depends_on": [a, b], "on_dependency_failure": "run"},
    ]
    same = [0, 0, 2, 3]  # the variant each one is the same submission as
    conns = [await asyncpg.connect(db_url) for _ in range(CLIENTS // 2)]
    try:
        async with aiohttp.ClientSession() as http:
            for round_ in range(ROUNDS):
                key = f"deps-race-{round_}"
                chosen = [rng.randrange(len(variants)) for _ in range(CLIENTS)]
                jobs = [
                    {"queue": "race", "type": "t", "idempotency_key": key} | variants[c]
                    for c in chosen
                ]
                answers = await _race(jobs, conns, http, api, rng)
                rows = await conns[0].fetch(
                    # (NULL is 'cancel': migration 0067)
                    "SELECT id, depends_on, coalesce(on_dependency_failure, 'cancel')"
                    " AS on_dependency_failure FROM evora.jobs WHERE idempotency_key = $1",
                    key,
                )
                assert len(rows) == 1
                stored = ({str(d) for d in rows[0]["depends_on"]}, rows[0]["on_dependency_failure"])
                winner = next(
                    n
                    for n, v in enumerate(variants)
                    if (set(v["depends_on"]), v.get("on_dependency_failure", "cancel")) == stored
                )
                expected = [
                    str(rows[0]["id"]) if same[c] == same[winner] else "conflict" for c in chosen
                ]
                assert answers == expected
                edges = await conns[0].fetchval(
                    "SELECT count(*) FROM evora.job_dependencies WHERE job_id = $1", rows[0]["id"]
                )
                assert edges == len(stored[0])
    finally:
        for conn in conns:
            await conn.close()
