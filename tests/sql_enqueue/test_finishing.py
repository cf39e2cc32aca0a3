"""Completing and failing a job in SQL, inside the worker's own transaction (evora.complete,
evora.fail; docs/sql-enqueue.md, "Finishing a job in SQL"): the same rules as the
dispatcher's HTTP acks, the outcome committed or rolled back with the worker's own data, a
lost lease raising (SQLSTATE EV409) and aborting that data with it."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

import aiohttp
import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.jobs import JobStore
from tests.conftest import Clock
from tests.polling import until
from tests.servers import Service
from tests.sql_enqueue.conftest import WORKER, MakeRole

LEASE = 30
ERROR = {"message": "boom", "type": "ValueError"}


class HttpWorker:
    """Outcomes sent to the real dispatcher: 'done:<state>', 'lease_lost' or 'not_found'."""

    def __init__(self, http: aiohttp.ClientSession, dispatcher: Service) -> None:
        self._http = http
        self._url = dispatcher.url

    async def _post(self, job_id: UUID, action: str, body: dict[str, Any]) -> str:
        async with self._http.post(
            f"{self._url}/v1/jobs/{job_id}/{action}", json=body, headers=WORKER
        ) as response:
            answer = await response.json()
            return {200: f"done:{answer.get('state')}", 404: "not_found", 409: "lease_lost"}[
                response.status
            ]

    async def complete(self, job_id: UUID, token: UUID, result: Any = None) -> str:
        return await self._post(job_id, "complete", {"lease_token": str(token), "result": result})

    async def fail(
        self,
        job_id: UUID,
        token: UUID,
        retryable: bool = True,
        retry_in: float | None = None,
        error: dict[str, Any] = ERROR,
    ) -> str:
        body: dict[str, Any] = {
            "lease_token": str(token),
            "error": {**error, "retryable": retryable},
        }
        if retry_in is not None:
            body["retry_in_seconds"] = retry_in
        return await self._post(job_id, "fail", body)


class SqlWorker:
    """The same outcomes through evora.complete/evora.fail, each in a transaction of the
    application's own connection."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn

    async def _call(self, statement: str, *args: Any) -> str:
        try:
            async with self._conn.transaction():
                return f"done:{await self._conn.fetchval(statement, *args)}"
        except asyncpg.PostgresError as e:
            return {"EV409": "lease_lost", "EV404": "not_found"}[e.sqlstate]

    async def complete(self, job_id: UUID, token: UUID, result: Any = None) -> str:
        return await self._call(
            "SELECT evora.complete($1, $2, $3::jsonb)", job_id, token, json.dumps(result)
        )

    async def fail(
        self,
        job_id: UUID,
        token: UUID,
        retryable: bool = True,
        retry_in: float | None = None,
        error: dict[str, Any] = ERROR,
    ) -> str:
        return await self._call(
            "SELECT evora.fail($1, $2, $3::jsonb, $4, $5)",
            job_id,
            token,
            json.dumps(error),
            retryable,
            retry_in,
        )


Worker = HttpWorker | SqlWorker
Case = Callable[[Worker, JobStore, Clock, str], Awaitable[list[str]]]


async def _claimed(store: JobStore, queue: str, max_attempts: int = 3) -> dict[str, Any]:
    await store.submit(
        JobSubmission(queue=queue, type="t", max_attempts=max_attempts, lease_seconds=LEASE)
    )
    [job] = await store.claim(worker_id="w", queues=[queue])
    return job


async def fresh(w: Worker, store: JobStore, clock: Clock, queue: str) -> list[str]:
    job = await _claimed(store, queue)
    return [await w.complete(job["id"], job["lease_token"], {"n": 1})]


async def repeated(w: Worker, store: JobStore, clock: Clock, queue: str) -> list[str]:
    job = await _claimed(store, queue)
    return [await w.complete(job["id"], job["lease_token"], {"n": 1}) for _ in range(2)]


async def stale(w: Worker, store: JobStore, clock: Clock, queue: str) -> list[str]:
    job = await _claimed(store, queue)
    await clock.advance(LEASE + 1)
    assert [j["id"] for j in await store.expire_leases()] == [job["id"]]
    await clock.advance(2)  # past the retry's backoff (1 s, jittered)
    [again] = await store.claim(worker_id="owner", queues=[queue])
    return [
        await w.complete(job["id"], job["lease_token"], {"n": 1}),
        await w.fail(job["id"], job["lease_token"]),
        await w.complete(again["id"], again["lease_token"], {"n": 2}),
    ]


async def after_cancel(w: Worker, store: JobStore, clock: Clock, queue: str) -> list[str]:
    completed = await _claimed(store, queue)
    await store.cancel(completed["id"])
    failed = await _claimed(store, queue)
    await store.cancel(failed["id"])
    return [
        await w.complete(completed["id"], completed["lease_token"]),
        await w.fail(failed["id"], failed["lease_token"]),
    ]


async def failures(w: Worker, store: JobStore, clock: Clock, queue: str) -> list[str]:
    retried = await _claimed(store, queue)
    answers = [await w.fail(retried["id"], retried["lease_token"], retry_in=3600)]
    answers.append(await w.fail(retried["id"], retried["lease_token"]))  # a repeat
    not_retryable = await _claimed(store, queue)
    answers.append(await w.fail(not_retryable["id"], not_retryable["lease_token"], False))
    last = await _claimed(store, queue, max_attempts=1)
    answers.append(await w.fail(last["id"], last["lease_token"]))
    return answers


async def unknown(w: Worker, store: JobStore, clock: Clock, queue: str) -> list[str]:
    return [await w.complete(uuid.uuid4(), uuid.uuid4()), await w.fail(uuid.uuid4(), uuid.uuid4())]


EXPECTED: dict[Case, list[str]] = {
    fresh: ["done:COMPLETED"],
    repeated: ["done:COMPLETED", "done:COMPLETED"],
    stale: ["lease_lost", "lease_lost", "done:COMPLETED"],
    after_cancel: ["done:COMPLETED", "done:CANCELLED"],
    failures: ["done:PENDING", "lease_lost", "done:DLQ", "done:DLQ"],
    unknown: ["not_found", "not_found"],
}


async def _observed(store: JobStore, queue: str) -> list[tuple[Any, ...]]:
    """What the case left: each job of its queue, in submission order, and its events (their
    data without the instant a retry is due)."""
    seen = []
    for job in (await store.list_jobs(queue=queue, limit=100)).jobs:
        events = await store.events(job["id"])
        seen.append(
            (
                job["state"],
                job["attempt"],
                job["result"],
                job["last_error"],
                [
                    (
                        e["event"],
                        e["from_state"],
                        e["to_state"],
                        e["attempt"],
                        {k: v for k, v in (e["data"] or {}).items() if k != "retry_at"},
                    )
                    for e in events
                ],
            )
        )
    return seen


async def test_sql_and_http_answer_every_case_alike(
    store: JobStore,
    clock: Clock,
    dispatcher: Service,
    app_conn: asyncpg.Connection,
) -> None:
    async with aiohttp.ClientSession() as http:
        workers: dict[str, Worker] = {
            "http": HttpWorker(http, dispatcher),
            "sql": SqlWorker(app_conn),
        }
        for case, expected in EXPECTED.items():
            seen = {}
            for name, worker in workers.items():
                queue = f"{case.__name__}-{name}"
                answers = await case(worker, store, clock, queue)
                assert answers == expected, (case.__name__, name)
                seen[name] = await _observed(store, queue)
            assert seen["sql"] == seen["http"], case.__name__


async def test_an_error_is_stored_alike_both_ways(
    store: JobStore, dispatcher: Service, app_conn: asyncpg.Connection
) -> None:
    """What a failure records is the same whichever way it came: a long message keeps its
    start, a long trace its end."""
    long = {
        "message": "m" * 9000 + "tail",
        "type": None,
        "traceback": "head" + "t" * 9000,
    }
    async with aiohttp.ClientSession() as http:
        stored = []
        for worker in (HttpWorker(http, dispatcher), SqlWorker(app_conn)):
            job = await _claimed(store, "errors")
            assert await worker.fail(job["id"], job["lease_token"], False, error=long) == "done:DLQ"
            stored.append((await store.get(job["id"]))["last_error"])
    assert stored[0] == stored[1] == {"message": "m" * 8192, "type": None, "traceback": "t" * 8192}


@pytest.mark.parametrize(
    ("error", "column"),
    [
        ({"type": "T"}, "error"),
        ({"message": 1}, "error"),
        ({"message": "m", "type": "x" * 256}, "error.type"),
        ({"message": "m", "traceback": ["a"]}, "error.traceback"),
        ({"message": "m", "retryable": False}, "error.retryable"),
    ],
)
async def test_a_failure_that_is_not_one_raises(
    store: JobStore, app_conn: asyncpg.Connection, error: dict[str, Any], column: str
) -> None:
    job = await _claimed(store, "errors")
    with pytest.raises(asyncpg.InvalidParameterValueError) as raised:
        await app_conn.fetchval(
            "SELECT evora.fail($1, $2, $3::jsonb)", job["id"], job["lease_token"], json.dumps(error)
        )
    assert raised.value.column_name == column
    assert (await store.get(job["id"]))["state"] == "RUNNING"


@pytest.mark.parametrize(
    "result",
    ['{"blob": "' + "x" * 1_048_576 + '"}', '{"n": 1e400}'],
    ids=["over the payload limit", "beyond a double"],
)
async def test_a_result_the_dispatcher_refuses_raises(
    store: JobStore, dispatcher: Service, app_conn: asyncpg.Connection, result: str
) -> None:
    """The bounds of client JSON hold for a result both ways: the dispatcher refuses it (413,
    422), evora.complete raises 22023 on `result`; the job stays RUNNING."""
    job = await _claimed(store, "results")
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{dispatcher.url}/v1/jobs/{job['id']}/complete",
            data=f'{{"lease_token": "{job["lease_token"]}", "result": {result}}}',
            headers={**WORKER, "Content-Type": "application/json"},
        ) as response,
    ):
        assert response.status in (413, 422)
    with pytest.raises(asyncpg.InvalidParameterValueError) as raised:
        await app_conn.fetchval(
            "SELECT evora.complete($1, $2, $3::jsonb)", job["id"], job["lease_token"], result
        )
    assert raised.value.column_name == "result"
    assert (await store.get(job["id"]))["state"] == "RUNNING"


async def _job(conn: asyncpg.Connection, job_id: UUID) -> asyncpg.Record:
    return await conn.fetchrow(
        "SELECT state, result, (SELECT array_agg(event ORDER BY seq) FROM evora.job_events e"
        " WHERE e.job_id = j.id) AS events FROM evora.jobs j WHERE id = $1",
        job_id,
    )


async def test_a_completion_commits_or_rolls_back_with_the_business_data(
    store: JobStore, app_conn: asyncpg.Connection, plain_conn: asyncpg.Connection, db_url: str
) -> None:
    await app_conn.execute("CREATE TABLE invoices (job uuid PRIMARY KEY)")
    job = await _claimed(store, "billing")
    other = await asyncpg.connect(db_url)
    try:
        for commit in (False, True):
            tx = app_conn.transaction()
            await tx.start()
            await app_conn.execute("INSERT INTO invoices VALUES ($1)", job["id"])
            assert (
                await app_conn.fetchval(
                    "SELECT evora.complete($1, $2, '{\"invoice\": 7}')",
                    job["id"],
                    job["lease_token"],
                )
                == "COMPLETED"
            )
            follow_up = await app_conn.fetchval("SELECT evora.submit('mail', 'invoice.send')")
            # nobody else sees any of it yet
            assert (await _job(other, job["id"]))["state"] == "RUNNING"
            assert (
                await other.fetchval("SELECT count(*) FROM evora.jobs WHERE id = $1", follow_up)
                == 0
            )
            if commit:
                await tx.commit()
            else:
                await tx.rollback()
        seen = await _job(other, job["id"])
        assert seen["state"] == "COMPLETED"
        assert json.loads(seen["result"]) == {"invoice": 7}
        assert seen["events"] == ["submitted", "claimed", "completed"]
        assert await other.fetchval("SELECT count(*) FROM invoices") == 1
        # the follow-up of the rolled-back attempt never existed; the committed one is claimable
        assert await other.fetchval("SELECT count(*) FROM evora.jobs WHERE queue = 'mail'") == 1
        assert [j["id"] for j in await store.claim(worker_id="m", queues=["mail"])] == [follow_up]
    finally:
        await other.close()


async def test_a_lost_lease_raises_and_aborts_the_business_transaction(
    store: JobStore, clock: Clock, app_conn: asyncpg.Connection
) -> None:
    await app_conn.execute("CREATE TABLE invoices (job uuid PRIMARY KEY)")
    job = await _claimed(store, "billing")
    await clock.advance(LEASE + 1)
    await store.expire_leases()
    tx = app_conn.transaction()
    await tx.start()
    await app_conn.execute("INSERT INTO invoices VALUES ($1)", job["id"])
    with pytest.raises(asyncpg.PostgresError) as raised:
        await app_conn.fetchval("SELECT evora.complete($1, $2)", job["id"], job["lease_token"])
    assert raised.value.sqlstate == "EV409"
    assert "lease" in raised.value.message and raised.value.hint
    with pytest.raises(asyncpg.InFailedSQLTransactionError):
        await app_conn.execute("SELECT 1")
    await tx.rollback()
    assert await app_conn.fetchval("SELECT count(*) FROM invoices") == 0
    with pytest.raises(asyncpg.PostgresError) as raised:
        await app_conn.fetchval(
            'SELECT evora.fail($1, $2, \'{"message": "x"}\')', uuid.uuid4(), uuid.uuid4()
        )
    assert raised.value.sqlstate == "EV404"


@pytest.mark.parametrize("commit", [True, False])
async def test_an_http_completion_waits_for_an_open_sql_completion(
    store: JobStore,
    dispatcher: Service,
    app_conn: asyncpg.Connection,
    plain_conn: asyncpg.Connection,
    db_url: str,
    commit: bool,
) -> None:
    """A worker completes in SQL and holds its transaction open; the same worker's retry over
    HTTP (same token) waits for it, then answers as a replay (it committed) or completes the
    job itself (it rolled back): one completion either way."""
    await app_conn.execute("CREATE TABLE invoices (job uuid PRIMARY KEY)")
    job = await _claimed(store, "billing")
    watcher = await asyncpg.connect(db_url)
    try:
        async with aiohttp.ClientSession() as http:
            tx = app_conn.transaction()
            await tx.start()
            await app_conn.execute("INSERT INTO invoices VALUES ($1)", job["id"])
            await app_conn.fetchval(
                "SELECT evora.complete($1, $2, '\"sql\"')", job["id"], job["lease_token"]
            )
            answer = asyncio.create_task(
                HttpWorker(http, dispatcher).complete(job["id"], job["lease_token"], "http")
            )

            async def waits_for_the_row() -> bool:
                return bool(
                    await watcher.fetchval(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    )
                )

            await until(waits_for_the_row, "the HTTP completion waits for the row")
            assert not answer.done()
            await (tx.commit() if commit else tx.rollback())
            assert await answer == "done:COMPLETED"
        seen = await _job(watcher, job["id"])
        assert seen["events"] == ["submitted", "claimed", "completed"]
        assert json.loads(seen["result"]) == ("sql" if commit else "http")
        assert await watcher.fetchval("SELECT count(*) FROM invoices") == (1 if commit else 0)
    finally:
        await watcher.close()


async def test_a_sql_completion_holding_its_row_keeps_the_sweeper_off(
    store: JobStore, clock: Clock, app_conn: asyncpg.Connection
) -> None:
    """The lease ran out while the worker's transaction, which completed the job, is still
    open: the sweeper skips the locked row, and the completion commits."""
    job = await _claimed(store, "billing")
    await clock.advance(LEASE + 1)
    async with app_conn.transaction():
        await app_conn.fetchval("SELECT evora.complete($1, $2)", job["id"], job["lease_token"])
        assert await store.expire_leases() == []
    assert await store.expire_leases() == []
    seen = await _job(app_conn, job["id"])
    assert (seen["state"], seen["events"]) == ("COMPLETED", ["submitted", "claimed", "completed"])


async def test_a_sql_completion_after_the_sweeper_expired_the_lease_raises(
    store: JobStore, clock: Clock, app_conn: asyncpg.Connection, pool: asyncpg.Pool
) -> None:
    """The sweeper's expiry holds the row (its transaction still open) when the worker's
    completion arrives: the completion waits, finds the attempt over and raises; the job
    goes to its next attempt as the sweeper decided."""
    job = await _claimed(store, "billing")
    await clock.advance(LEASE + 1)
    async with pool.acquire() as sweeper:
        tx = sweeper.transaction()
        await tx.start()
        assert len(await sweeper.fetch(queries.EXPIRE_LEASES, 10, [])) == 1
        completion = asyncio.create_task(
            app_conn.fetchval("SELECT evora.complete($1, $2)", job["id"], job["lease_token"])
        )

        async def waits_for_the_row() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            )

        await until(waits_for_the_row, "the completion waits for the row")
        await tx.commit()
    with pytest.raises(asyncpg.PostgresError) as raised:
        await completion
    assert raised.value.sqlstate == "EV409"
    seen = await _job(app_conn, job["id"])
    assert (seen["state"], seen["events"]) == ("PENDING", ["submitted", "claimed", "lease_expired"])


async def test_sql_completions_race_the_sweeper_one_outcome_each(
    store: JobStore, clock: Clock, db_url: str, pool: asyncpg.Pool
) -> None:
    """Autocommit completions against expiries of the same leases, all at once: each job ends
    exactly one way, and a completion answered 'done' is exactly a COMPLETED job."""
    jobs = 20
    await store.submit_batch(
        [JobSubmission(queue="race", type="t", lease_seconds=LEASE) for _ in range(jobs)]
    )
    claimed = await store.claim(worker_id="w", queues=["race"], max_jobs=jobs)
    await clock.advance(LEASE + 1)
    workers = await asyncpg.create_pool(db_url, min_size=4, max_size=4)
    try:

        async def complete(job: dict[str, Any]) -> str:
            try:
                await workers.fetchval(
                    "SELECT evora.complete($1, $2)", job["id"], job["lease_token"]
                )
                return "done"
            except asyncpg.PostgresError as e:
                return str(e.sqlstate)

        async def sweep() -> None:
            while await store.expire_leases(batch=3):
                pass

        *done, _ = await asyncio.gather(*(complete(j) for j in claimed), sweep())
    finally:
        await workers.close()
    assert set(done) <= {"done", "EV409"}
    for job, answer in zip(claimed, done, strict=True):
        events = [e["event"] for e in await store.events(job["id"])]
        assert events[-1] == ("completed" if answer == "done" else "lease_expired")
        assert len(events) == 3


async def test_the_role_evora_worker_finishes_jobs_and_does_nothing_else(
    make_role: MakeRole, store: JobStore
) -> None:
    done, failed = await _claimed(store, "roles"), await _claimed(store, "roles")
    conn = await asyncpg.connect(await make_role("evora_worker"))
    try:
        assert (
            await conn.fetchval("SELECT evora.complete($1, $2)", done["id"], done["lease_token"])
            == "COMPLETED"
        )
        assert (
            await conn.fetchval(
                'SELECT evora.fail($1, $2, \'{"message": "no"}\', false)',
                failed["id"],
                failed["lease_token"],
            )
            == "DLQ"
        )
        for statement in (
            "SELECT count(*) FROM evora.jobs",
            "SELECT * FROM evora.complete_items('{}', '{}', '{}', '{}', false)",
            "SELECT * FROM evora.fail_items('{}', '{}', '{}', '{}', '{}', '{}', false)",
            "SELECT evora.submit('q', 't')",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(statement)
    finally:
        await conn.close()
    without = await asyncpg.connect(await make_role())
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await without.execute("SELECT evora.complete(gen_random_uuid(), gen_random_uuid())")
    finally:
        await without.close()
