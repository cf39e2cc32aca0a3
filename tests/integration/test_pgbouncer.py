"""Evora through Debian's stock PgBouncer (1.18): in session mode with its timeouts, and in
transaction mode without statements prepared by name, which a pooler hands to other clients'
server connections (docs/deploy.md)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any
from uuid import UUID

import aiohttp
import asyncpg
import pytest

from evora.config import ConfigError, Settings
from evora.protocol.jobs import JobSubmission
from evora.storage.db import connect, create_pool
from evora.storage.jobs import AckResult, Completion, JobStore
from evora.storage.leadership import AdvisoryLeader
from evora.storage.migrate import MigrationError, apply_migrations, missing_versions
from evora_services.dispatcher.state import DISPATCH
from evora_services.projector.app import create_app as create_projector
from evora_services.sweeper.app import create_app as create_sweeper
from tests.cli.commands import evora, one_line
from tests.conftest import _admin, _with_database
from tests.e2e.conftest import scrape
from tests.pgbouncer import pgbouncer, through
from tests.polling import until
from tests.servers import PRODUCER_TOKEN, WORKER_TOKEN, start_api, start_dispatcher

RUN_TIMEOUT_S = 120.0
WORKERS = 20
JOBS_PER_WORKER = 5
APPS = {"sweeper": create_sweeper, "projector": create_projector}


async def test_session_mode_migrates_and_keeps_the_timeouts(pg_server_url: str) -> None:
    # A stock PgBouncer refuses a startup packet with a parameter it does not track:
    # "unsupported startup parameter: idle_in_transaction_session_timeout".
    name = f"pgbouncer_{random.getrandbits(48):x}"
    await _admin(pg_server_url, f'CREATE DATABASE "{name}"')
    try:
        with pgbouncer(pg_server_url, "session") as port:
            url = through(_with_database(pg_server_url, name), port)
            assert await apply_migrations(url, pooler="session")
            # as the dispatcher's pool: with generic plans
            pool = await create_pool(
                url, min_size=2, max_size=2, pooler="session", generic_plans=True
            )
            try:
                for _ in range(3):  # and still after the pool took the connection back
                    async with pool.acquire() as conn:
                        shown = await conn.fetchrow(
                            "SELECT current_setting('statement_timeout') AS statement,"
                            " current_setting('idle_in_transaction_session_timeout') AS idle,"
                            " current_setting('jit') AS jit,"
                            " current_setting('plan_cache_mode') AS plans"
                        )
                    assert dict(shown) == {
                        "statement": "30s",
                        "idle": "1min",
                        "jit": "off",
                        "plans": "force_generic_plan",
                    }
            finally:
                await pool.close()
            conn = await connect(url, statement_timeout=None, pooler="session")
            try:
                assert await missing_versions(conn) == []
                assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "1min"
            finally:
                await conn.close()
    finally:
        await _admin(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_transaction_mode_refuses_to_migrate_and_says_how(
    db_url: str, pg_server_url: str
) -> None:
    # The migrations' session advisory lock would stay on whichever server connection took
    # it, and two `evora migrate` would both run.
    with (
        pgbouncer(pg_server_url, "transaction") as port,
        pytest.raises(MigrationError, match="EVORA_DIRECT_DATABASE_URL"),
    ):
        await apply_migrations(through(db_url, port), pooler="transaction")


CLIENTS = 16
JOBS = 2_000


async def test_transaction_mode_many_clients_on_few_server_connections(
    db_url: str, pg_server_url: str
) -> None:
    """16 client connections share 4 server connections, each transaction on whichever is
    free: with statements prepared by name a client binds one another client prepared (or
    that does not exist there), and a row described for one statement arrives for another."""
    queue = "pooled"
    with pgbouncer(pg_server_url, "transaction", pool_size=4) as port:
        pool = await create_pool(
            through(db_url, port), min_size=CLIENTS, max_size=CLIENTS, pooler="transaction"
        )
        try:
            store = JobStore(pool)
            start = asyncio.Barrier(CLIENTS)

            async def client(index: int) -> list[UUID]:
                rng = random.Random(index)
                worker = f"worker-{index}"
                await start.wait()
                submitted = await store.submit_batch(
                    [
                        JobSubmission(queue=queue, type="t", payload={"client": index, "n": n})
                        for n in range(JOBS // CLIENTS)
                    ]
                )
                assert all(r.created for r in submitted)
                claimed: list[UUID] = []
                while True:
                    jobs = await store.claim(
                        worker_id=worker, queues=[queue], max_jobs=rng.randint(1, 30)
                    )
                    if not jobs:
                        return claimed
                    assert {job["worker_id"] for job in jobs} == {worker}
                    outcomes = await store.complete_many(
                        [Completion(job["id"], job["lease_token"], {"by": index}) for job in jobs]
                    )
                    assert [o.result for o in outcomes] == [AckResult.DONE] * len(jobs)
                    claimed.extend(job["id"] for job in jobs)

            async with asyncio.timeout(RUN_TIMEOUT_S):
                per_client = await asyncio.gather(*(client(i) for i in range(CLIENTS)))
        finally:
            await pool.close()
    every = [job_id for claimed in per_client for job_id in claimed]
    assert len(every) == len(set(every)) == JOBS


async def test_transaction_mode_services_answer_every_request_and_wake_by_polling(
    db_url: str, pg_server_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The api and the dispatcher behind transaction pooling, without a direct URL: every
    submit, long-poll claim and ack answers 200, each job is claimed once, and long-polls
    waiting before the jobs existed are woken by the fallback poll (there is no LISTEN)."""
    queue = "pooled-services"
    with pgbouncer(pg_server_url, "transaction", pool_size=3) as port:
        url = through(db_url, port)
        api = await start_api(url, database_pooler="transaction")
        dispatcher = await start_dispatcher(url, database_pooler="transaction")
        try:
            async with aiohttp.ClientSession() as http, contextlib.AsyncExitStack() as stack:

                async def call(
                    base: str, path: str, token: str, body: dict[str, Any]
                ) -> dict[str, Any]:
                    async with http.post(
                        base + path, json=body, headers={"Authorization": f"Bearer {token}"}
                    ) as response:
                        answer = await response.json()
                        assert response.status in (200, 201), (path, response.status, answer)
                        return dict(answer)

                async def worker(index: int) -> list[str]:
                    claimed: list[str] = []
                    while len(claimed) < JOBS_PER_WORKER:
                        body = {"worker_id": f"w{index}", "queues": [queue], "wait_seconds": 10}
                        jobs = (await call(dispatcher.url, "/v1/claim", WORKER_TOKEN, body))["jobs"]
                        acks = [
                            {"id": j["id"], "lease_token": j["lease_token"], "outcome": "complete"}
                            for j in jobs
                        ]
                        if acks:
                            await call(dispatcher.url, "/v1/acks", WORKER_TOKEN, {"acks": acks})
                        claimed.extend(j["id"] for j in jobs)
                    return claimed

                workers = [asyncio.create_task(worker(i)) for i in range(WORKERS)]
                stack.push_async_callback(_cancel_all, workers)
                await until(
                    lambda: dispatcher.app[DISPATCH].wakeups.waiting().get(queue, 0) == WORKERS,
                    "every worker's long-poll waits",
                )
                submitted = await asyncio.gather(
                    *(
                        call(api.url, "/v1/jobs", PRODUCER_TOKEN, {"queue": queue, "type": "t"})
                        for _ in range(WORKERS * JOBS_PER_WORKER)
                    )
                )
                async with asyncio.timeout(RUN_TIMEOUT_S):
                    per_worker = await asyncio.gather(*workers)
                samples = await scrape(http, dispatcher.url)
        finally:
            await dispatcher.close()
            await api.close()
    every = [job_id for claimed in per_worker for job_id in claimed]
    assert sorted(every) == sorted(answer["id"] for answer in submitted)
    # No LISTEN, and it says so: the long-polls that waited for the jobs were woken by the
    # fallback poll and passed it on (chain), never by a notification.
    assert samples[("evora_dispatcher_listener_connected",)] == 0
    logged = [record.getMessage() for record in caplog.records]
    assert any("long-polls are woken by polling" in line for line in logged)
    # not a LISTEN connection tried through the pooler and failing (or, with PgBouncer's
    # ignore_startup_parameters, "connected" and never notified) over and over
    assert not [line for line in logged if "LISTEN" in line and "lost" in line]
    assert samples.get(("evora_dispatcher_wakeups_total", "cause=notify"), 0) == 0


async def _cancel_all(tasks: list[asyncio.Task[Any]]) -> None:
    """Workers still waiting when the test failed: cancelled before their services go."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("service", ["sweeper", "projector"])
def test_transaction_mode_leaders_need_a_direct_url(service: str, db_url: str) -> None:
    """A session advisory lock behind transaction pooling would be orphaned on a server
    connection (a lone projector once stood by forever): refused, naming the way out."""
    settings = Settings(
        database_url=db_url,
        database_pooler="transaction",
        mongo_url="mongodb://127.0.0.1:1",
        auth="disabled",
    )
    with pytest.raises(ConfigError, match="EVORA_DIRECT_DATABASE_URL"):
        asyncio.run(APPS[service](settings))


def test_evora_migrate_through_pgbouncer_in_each_mode(pg_server_url: str) -> None:
    """What an operator sees: without EVORA_DATABASE_POOLER one line naming it (not
    asyncpg's traceback); in session mode migrations run, and run again; in transaction mode
    one line naming EVORA_DIRECT_DATABASE_URL, and with it they run."""
    name = f"pgbouncer_cli_{random.getrandbits(48):x}"
    asyncio.run(_admin(pg_server_url, f'CREATE DATABASE "{name}"'))
    direct = _with_database(pg_server_url, name)
    try:
        with pgbouncer(pg_server_url, "session") as port:
            url = through(direct, port)
            unset = evora("migrate", env={"EVORA_DATABASE_URL": url})
            assert unset.returncode == 1
            line = one_line(unset.stderr)
            assert "unsupported startup parameter" in line
            assert "EVORA_DATABASE_POOLER" in line
            for expected in ("applied migrations: 0001", "database is up to date"):
                again = evora(
                    "migrate", env={"EVORA_DATABASE_URL": url, "EVORA_DATABASE_POOLER": "session"}
                )
                assert again.returncode == 0, again.stderr
                assert again.stdout.startswith(expected)
        with pgbouncer(pg_server_url, "transaction") as port:
            env = {
                "EVORA_DATABASE_URL": through(direct, port),
                "EVORA_DATABASE_POOLER": "transaction",
            }
            refused = evora("migrate", env=env)
            assert refused.returncode == 2
            assert "EVORA_DIRECT_DATABASE_URL" in one_line(refused.stderr)
            done = evora("migrate", env={**env, "EVORA_DIRECT_DATABASE_URL": direct})
            assert done.returncode == 0, done.stderr
            assert done.stdout.startswith("database is up to date")
    finally:
        asyncio.run(_admin(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def test_session_mode_standby_takes_over_when_the_leader_session_dies(
    db_url: str, pg_server_url: str
) -> None:
    """Two replicas' leaders through a session pool: one leads, the other stands by; when
    the leader's server session dies PgBouncer drops its client, and the standby leads."""
    leading: list[str] = []

    def leader(name: str) -> AdvisoryLeader:
        def changed(active: bool) -> None:
            if active:
                leading.append(name)

        return AdvisoryLeader(
            url, 0x7E58, name=name, standby_seconds=0.1, on_change=changed, pooler="session"
        )

    async def lead(ended: asyncio.Event) -> None:
        await ended.wait()

    stop = asyncio.Event()
    with pgbouncer(pg_server_url, "session") as port:
        url = through(db_url, port)
        first = asyncio.create_task(leader("evora-test-a").run(lead, stop))
        await until(lambda: leading == ["evora-test-a"], "a leads")
        second = asyncio.create_task(leader("evora-test-b").run(lead, stop))
        admin = await connect(db_url)
        try:
            await until(lambda: _has_session(admin, "evora-test-b"), "b connects and stands by")
            assert leading == ["evora-test-a"]
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'evora-test-a'"
            )
            await until(lambda: leading[1:2] == ["evora-test-b"], "b takes over", within=15)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(first, second), 30)
            await admin.close()


async def _has_session(conn: asyncpg.Connection, name: str) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name
        )
    )
