"""Evora through Debian's stock PgBouncer (1.18): in session mode with its timeouts, and in
transaction mode without statements prepared by name, which a pooler hands to other clients'
server connections (docs/deploy.md)."""

from __future__ import annotations

import asyncio
import random
from uuid import UUID

import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage.db import POOLER_ENV, connect, create_pool
from evora.storage.jobs import AckResult, Completion, JobStore
from evora.storage.migrate import MigrationError, apply_migrations, missing_versions
from tests.conftest import _admin, _with_database
from tests.pgbouncer import pgbouncer, through

RUN_TIMEOUT_S = 120.0


async def test_session_mode_migrates_and_keeps_the_timeouts(
    pg_server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stock PgBouncer refuses a startup packet with a parameter it does not track:
    # "unsupported startup parameter: idle_in_transaction_session_timeout".
    monkeypatch.setenv(POOLER_ENV, "session")
    name = f"pgbouncer_{random.getrandbits(48):x}"
    await _admin(pg_server_url, f'CREATE DATABASE "{name}"')
    try:
        with pgbouncer(pg_server_url, "session") as port:
            url = through(_with_database(pg_server_url, name), port)
            assert await apply_migrations(url)
            pool = await create_pool(url, min_size=2, max_size=2)
            try:
                async with pool.acquire() as conn:
                    shown = await conn.fetchrow(
                        "SELECT current_setting('statement_timeout') AS statement,"
                        " current_setting('idle_in_transaction_session_timeout') AS idle,"
                        " current_setting('jit') AS jit"
                    )
                assert dict(shown) == {"statement": "30s", "idle": "1min", "jit": "off"}
            finally:
                await pool.close()
            conn = await connect(url, statement_timeout=None)
            try:
                assert await missing_versions(conn) == []
                assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "1min"
            finally:
                await conn.close()
    finally:
        await _admin(pg_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_transaction_mode_refuses_to_migrate_and_says_how(
    db_url: str, pg_server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The migrations' session advisory lock would stay on whichever server connection took
    # it, and two `evora migrate` would both run.
    monkeypatch.setenv(POOLER_ENV, "transaction")
    with (
        pgbouncer(pg_server_url, "transaction") as port,
        pytest.raises(MigrationError, match="direct"),
    ):
        await apply_migrations(through(db_url, port))


CLIENTS = 16
JOBS = 2_000


async def test_transaction_mode_many_clients_on_few_server_connections(
    db_url: str, pg_server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 client connections share 4 server connections, each transaction on whichever is
    free: with statements prepared by name a client binds one another client prepared (or
    that does not exist there), and a row described for one statement arrives for another."""
    monkeypatch.setenv(POOLER_ENV, "transaction")
    queue = "pooled"
    with pgbouncer(pg_server_url, "transaction", pool_size=4) as port:
        pool = await create_pool(through(db_url, port), min_size=CLIENTS, max_size=CLIENTS)
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
