"""The projector's lag metrics are measured against the truth: a transaction open in another
database of the same cluster holds the read models back no longer, and the gauges reach 0
while it stays open; a restarted projector says how far behind it starts, never 0 (a real
`evora projector` process, scraped as Prometheus would)."""

from __future__ import annotations

import signal

import aiohttp
import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import JobStore
from tests.e2e.conftest import Children, scrape
from tests.fuzz.conftest import spawn
from tests.polling import until

JOBS = 40
BACKLOG = 3000


async def _gauge(http: aiohttp.ClientSession, url: str, name: str) -> float:
    return (await scrape(http, url))[(name,)]


async def test_a_transaction_elsewhere_holds_neither_the_read_models_nor_their_lag_back(
    db_url: str,
    pg_server_url: str,
    mongo_url: str,
    mongo_db_name: str,
    store: JobStore,
    pool: asyncpg.Pool,
    children: Children,
) -> None:
    _, url = await spawn(
        children, "projector", db_url, EVORA_MONGO_URL=mongo_url, EVORA_MONGO_DB=mongo_db_name
    )
    async with aiohttp.ClientSession() as http:
        # Another database of the cluster: an application's session that wrote something and
        # sits idle in its transaction. Its xid is in every snapshot of the cluster, and the
        # outbox reader reads past it.
        other = await asyncpg.connect(pg_server_url)
        try:
            held = other.transaction()
            await held.start()
            await other.fetchval("SELECT txid_current()")
            for _ in range(JOBS):
                await store.submit(JobSubmission(queue="lag", type="t"))
            newest = await pool.fetchval("SELECT max(seq) FROM evora.job_events")

            async def caught_up() -> bool:
                samples = await scrape(http, url)
                return (
                    samples[("evora_projector_events_behind",)] == 0
                    and samples[("evora_projector_seconds_behind",)] == 0
                    and samples[("evora_projector_last_seq",)] >= newest
                )

            await until(caught_up, "the projector catches up while it stays open", within=15)
            await held.rollback()
        finally:
            await other.close()


async def test_a_restarted_projector_never_reports_caught_up_while_behind(
    db_url: str,
    mongo_url: str,
    mongo_db_name: str,
    store: JobStore,
    pool: asyncpg.Pool,
    children: Children,
) -> None:
    """Until a new leader has measured, its lag gauges are NaN, not 0: every scrape from the
    moment it answers either says how far behind it is or comes after it caught up."""
    env = {"EVORA_MONGO_URL": mongo_url, "EVORA_MONGO_DB": mongo_db_name}
    first, _ = await spawn(children, "projector", db_url, **env)
    first.send(signal.SIGKILL)
    await first.wait(within=10)
    await store.submit_batch([JobSubmission(queue="lag", type="t") for _ in range(BACKLOG)])
    newest = await pool.fetchval("SELECT max(seq) FROM evora.job_events")
    _, url = await spawn(children, "projector", db_url, **env)
    async with aiohttp.ClientSession() as http:
        readings: list[tuple[float, float]] = []

        async def caught_up() -> bool:
            samples = await scrape(http, url)
            behind = samples[("evora_projector_events_behind",)]
            applied = samples[("evora_projector_last_seq",)]
            readings.append((behind, applied))
            return behind == 0 and applied >= newest

        await until(caught_up, "the restarted projector catches up", within=60)
    said_zero_while_behind = [(b, a) for b, a in readings if b == 0 and a < newest]
    assert not said_zero_while_behind, (newest, readings)
