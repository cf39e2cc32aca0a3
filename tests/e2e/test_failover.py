"""A failover to an asynchronous standby that lost commits the projector had counted.

The projector stores each span's target (a pg_snapshot) in MongoDB, and every event whose
xid the target counts finished is read once and never again. A standby that streams
asynchronously can be promoted without the primary's last commits: its next xid is the one
after the last it replayed, so it hands the lost transactions' xids out again, and a new
transaction's events sit below the stored target's xmax and outside its running list, never
read, while the lost transactions' events stay counted in the read models.

Here, for real: a primary and a streaming standby (`pg_basebackup -R`), `evora api` and
`evora projector` as processes on the primary's address. The primary's walsender is frozen
(SIGSTOP), so nothing committed after that reaches the standby; then 300 transactions that
take an xid and 5 submissions commit on the primary alone, and the projector counts the
submissions (its target stored past all of them). The primary is killed (SIGKILL, every
process), the standby promoted (`pg_promote()`) and started on the primary's address, as a
virtual IP or a DNS name moving would present it: the services reconnect on their own. New
jobs are submitted there and take the lost xids again. The read models must converge to the
tables anyway (the projector notices the new timeline and rebuilds), and go on converging.
So must they after a switchover that loses nothing (the primary stopped cleanly, the standby
promoted), which is rebuilt all the same.

Frozen on the primary's side, not the standby's walreceiver: WAL already sent sits in the
walreceiver's socket until it reads again, so a frozen walreceiver can still get, after it
resumes, commits made while it was frozen; a frozen walsender sends nothing more."""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
import asyncpg
import pytest

from evora import Client
from evora.embedded import LocalPostgres
from tests.e2e.clusters import cluster_dir, migrated_primary
from tests.e2e.conftest import Children, scrape
from tests.e2e.test_postgres_crash import _kill_cluster
from tests.e2e.test_read_replica import _standby_of
from tests.fuzz.conftest import spawn
from tests.polling import until
from tests.servers import ADMIN_TOKEN, PRODUCER_TOKEN

LOST_XIDS = 300  # transactions with an xid committed on the primary alone
LAST_JOBS = 5  # and submissions (queue "last")
AFTER_JOBS = 3  # submissions after the failover (given lost xids again, if any)
HISTORY_CHANGES = "evora_projector_history_changes_total"

Counts = dict[str, dict[str, int]]  # queue -> state -> jobs, with "submitted" for the total


async def _tables(dsn: str) -> Counts:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT queue, state::text, count(*) FROM evora.jobs GROUP BY 1, 2")
    finally:
        await conn.close()
    counts: Counts = {}
    for queue, state, jobs in rows:
        counts.setdefault(queue, {})[state] = jobs
        counts[queue]["submitted"] = counts[queue].get("submitted", 0) + jobs
    return counts


async def _read_models(admin: Client) -> Counts:
    counts: Counts = {}
    for stats in await admin.queues():
        held = {state: n for state, n in stats["counts"].items() if n}
        if held or stats["totals"]["submitted"]:
            counts[stats["queue"]] = {**held, "submitted": stats["totals"]["submitted"]}
    return counts


async def _replayed(standby: LocalPostgres, job_id: str) -> bool:
    conn = await asyncpg.connect(standby.dsn())
    try:
        return bool(await conn.fetchval("SELECT count(*) FROM evora.jobs WHERE id = $1", job_id))
    finally:
        await conn.close()


@pytest.mark.parametrize("lost", [True, False], ids=["asynchronous failover", "switchover"])
async def test_the_read_models_converge_after_a_failover(
    lost: bool, mongo_url: str, mongo_db_name: str, children: Children
) -> None:
    """`lost`: the standby lacks the primary's last commits (its walsender frozen, the primary
    killed); otherwise a switchover that loses nothing (the primary stopped cleanly, which
    sends the standby all it wrote), rebuilt all the same."""
    with cluster_dir("evora-test-failover-") as tmp:
        primary = await migrated_primary(tmp / "primary")
        await asyncio.to_thread(primary.start)
        servers = [primary]
        try:
            standby = await asyncio.to_thread(
                _standby_of, primary, tmp / "standby", apply_delay_ms=None
            )
            servers.append(standby)
            await asyncio.to_thread(standby.start)
            mongo = {"EVORA_MONGO_URL": mongo_url, "EVORA_MONGO_DB": mongo_db_name}
            _, api = await spawn(children, "api", primary.dsn(), **mongo)
            projector, projector_url = await spawn(children, "projector", primary.dsn(), **mongo)
            async with (
                Client(api, PRODUCER_TOKEN) as producer,
                Client(api, ADMIN_TOKEN) as admin,
                aiohttp.ClientSession() as http,
            ):
                seen: list[tuple[Counts, Counts]] = []

                async def converged() -> bool:
                    seen[:] = [(await _read_models(admin), await _tables(primary.dsn()))]
                    return seen[0][0] == seen[0][1]

                async def converge(what: str, within: float = 10.0) -> None:
                    try:
                        await until(converged, what, within=within)
                    except AssertionError as exc:
                        read_models, tables = seen[0]
                        raise AssertionError(
                            f"{exc}: read models {read_models}, tables {tables}"
                        ) from None

                kept = await producer.submit("kept", "t", {})
                await until(lambda: _replayed(standby, kept.id), "the standby has the job")
                await converge("the read models count the first job")

                conn = await asyncpg.connect(primary.dsn())
                try:
                    walsender = await conn.fetchval(
                        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walsender'"
                    )
                    if lost:
                        os.kill(walsender, signal.SIGSTOP)  # the standby gets nothing more
                    for _ in range(LOST_XIDS):
                        await conn.fetchval("SELECT pg_current_xact_id()::text")
                    lost_above = int(await conn.fetchval("SELECT pg_current_xact_id()::text"))
                finally:
                    await conn.close()
                last = [
                    await producer.submit("last", "t", {}, idempotency_key=f"last-{i}")
                    for i in range(LAST_JOBS)
                ]
                await converge("the read models count the primary's last jobs")

                if lost:
                    await _kill_cluster(primary)
                else:
                    await asyncio.to_thread(primary.stop)
                    assert await _replayed(standby, last[-1].id)
                conn = await asyncpg.connect(standby.dsn())
                try:
                    assert await conn.fetchval("SELECT pg_promote()")
                finally:
                    await conn.close()
                await asyncio.to_thread(standby.stop)
                new_primary = LocalPostgres(standby.data_dir, primary.port, durable=False)
                servers.append(new_primary)
                await asyncio.to_thread(new_primary.start)  # the services reconnect by themselves

                one = {"PENDING": 1, "submitted": 1}
                last_ones = {"PENDING": LAST_JOBS, "submitted": LAST_JOBS}
                assert await _tables(primary.dsn()) == (
                    {"kept": one} if lost else {"kept": one, "last": last_ones}
                )
                after = [
                    await producer.submit("after", "t", {}, idempotency_key=f"after-{i}")
                    for i in range(AFTER_JOBS)
                ]
                conn = await asyncpg.connect(primary.dsn())
                try:
                    xids = await conn.fetch(
                        "SELECT xid::text::int8 FROM evora.job_events WHERE job_id = ANY ($1)",
                        [job.id for job in after],
                    )
                finally:
                    await conn.close()
                # they took xids the lost transactions had (those the stored target counts)
                assert all(row[0] < lost_above for row in xids) == lost, (xids, lost_above)

                await converge("the read models equal the tables again", within=60)
                # and stay right: later submissions are counted as usual, with no new rebuild
                for i in range(AFTER_JOBS):
                    await producer.submit("after", "t", {}, idempotency_key=f"later-{i}")
                await converge("the read models count later jobs", within=30)
                assert await _read_models(admin) == {
                    "kept": one,
                    **({} if lost else {"last": last_ones}),
                    "after": {"PENDING": 2 * AFTER_JOBS, "submitted": 2 * AFTER_JOBS},
                }
                assert (await scrape(http, projector_url))[(HISTORY_CHANGES,)] == 1
                assert "rebuilding" in projector.output(), projector.output()
        finally:
            for server in reversed(servers):
                await asyncio.to_thread(server.stop)
