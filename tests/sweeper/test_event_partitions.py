"""Event retention by partition (migration 0032, docs/deploy.md "Retention"): job_events is
partitioned by time; the sweeper makes partitions ahead of the clock and removes a whole
partition once every event in it is older than the events window, consumed by every
projector generation and, with EVORA_ARCHIVE_EVENTS on, archived. Events grow old by running
the database's clock ahead (the `clock` fixture)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from evora.http.metrics import ServiceMetrics
from evora.protocol.jobs import JobSubmission
from evora.protocol.states import JobState
from evora.storage import audit as audit_module
from evora.storage import retention as retention_module
from evora.storage.audit import audit
from evora.storage.jobs import JobStore
from evora.storage.retention import (
    ABANDONED_REBUILD_SECONDS,
    RetentionStore,
    record_projector_progress,
)
from evora_services.sweeper.metrics import SweeperMetrics
from evora_services.sweeper.sweeper import Retention, Sweeper, Tuning
from tests.conftest import Clock
from tests.polling import until

DAY = 86_400

MakeSweeper = Callable[..., Sweeper]


@pytest.fixture
def make_sweeper(pool: asyncpg.Pool) -> MakeSweeper:
    """A sweeper on the test's pool, driven pass by pass (no leadership, no loops)."""

    def make(**retention: Any) -> Sweeper:
        windows = Retention(
            jobs=dict.fromkeys((JobState.COMPLETED, JobState.CANCELLED, JobState.DLQ), DAY),
            idempotency_keys=DAY,
            events=DAY,
            **retention,
        )
        return Sweeper(
            JobStore(pool),
            RetentionStore(pool),
            SweeperMetrics(ServiceMetrics("sweeper")),
            windows,
            Tuning(),
        )

    return make


async def submit(store: JobStore, n: int) -> list[UUID]:
    """`n` jobs. Their `submitted` events are dated by the real clock; a transition's event
    (`cancel`) by the database's, which the tests run ahead."""
    return [(await store.submit(JobSubmission(queue="q", type="t"))).job["id"] for _ in range(n)]


async def cancel(store: JobStore, ids: list[UUID]) -> None:
    for job_id in ids:
        await store.cancel(job_id)


async def event_count(pool: asyncpg.Pool) -> int:
    count: int = await pool.fetchval("SELECT count(*) FROM evora.job_events")
    return count


async def partitions(pool: asyncpg.Pool) -> list[str]:
    return [r["name"] for r in await pool.fetch("SELECT name FROM evora.event_partitions()")]


async def partition_of_first_event(pool: asyncpg.Pool) -> str:
    """The range's partition (named as the rows' are) that holds the first event, a row or a
    statement's batch (migration 0064)."""
    name: str = await pool.fetchval(
        "SELECT replace(c.relname::text, 'event_batches_p', 'job_events_p')"
        " FROM (SELECT seq, tableoid FROM evora.job_event_rows"
        "       UNION ALL SELECT seq, tableoid FROM evora.event_batches) e"
        " JOIN pg_class c ON c.oid = e.tableoid ORDER BY e.seq LIMIT 1"
    )
    return name


async def consumed(pool: asyncpg.Pool, generation: int = 1, active: bool = True) -> None:
    """Generation `generation` has consumed everything committed so far."""
    snapshot = await pool.fetchval("SELECT pg_current_snapshot()::text")
    await record_projector_progress(pool, generation, snapshot, active)


async def test_without_the_archive_old_events_go_with_their_partition(
    make_sweeper: MakeSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    # A deployment that runs no pipeline: on c19c6d0 its events were kept for ever.
    young = (await submit(store, 5))[:2]
    await consumed(pool)
    old = await partition_of_first_event(pool)
    await clock.advance(3 * DAY)
    await cancel(store, young)  # in a partition of today's: younger than the window
    removed = await make_sweeper().prune_due()
    assert removed["event_partitions"] >= 1
    assert await event_count(pool) == 2
    assert old not in await partitions(pool)
    # job_events stays append-only: no row was deleted, whole tables went
    stats = await pool.fetchval(
        "SELECT coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables"
        " WHERE relname LIKE 'job\\_events%' OR relname LIKE 'event\\_batches%'"
    )
    assert stats == 0


async def test_a_partition_waits_for_every_projector_generation(
    make_sweeper: MakeSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    await consumed(pool, generation=1)  # a rebuild's generation, before the events
    await submit(store, 5)
    await consumed(pool, generation=2, active=False)
    await clock.advance(3 * DAY)
    sweeper = make_sweeper()
    # (an empty partition older than the window, like the one the template database's
    # migration made long before this test in a full run, may go in the same round)
    await sweeper.prune_due()
    assert await event_count(pool) == 5
    await consumed(pool, generation=1)
    assert (await sweeper.prune_due())["event_partitions"] >= 1
    assert await event_count(pool) == 0


async def test_with_archiving_on_a_partition_waits_for_the_archive(
    make_sweeper: MakeSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    await submit(store, 5)
    await consumed(pool)
    await clock.advance(3 * DAY)
    sweeper = make_sweeper(archive_events=True)
    # (an empty partition older than the window, like the one the template database's
    # migration made long before this test in a full run, may go in the same round)
    await sweeper.prune_due()
    assert await event_count(pool) == 5
    await pool.execute(
        "UPDATE evora.event_archive_watermark SET upto_seq = 4, below_xid = '999999999'"
    )
    await sweeper.prune_due()
    assert await event_count(pool) == 5  # seq 5 is not archived
    await pool.execute("UPDATE evora.event_archive_watermark SET upto_seq = 5")
    assert (await sweeper.prune_due())["event_partitions"] >= 1
    assert await event_count(pool) == 0


async def test_partitions_are_made_ahead_as_the_clock_runs(
    make_sweeper: MakeSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    ids = await submit(store, 2)
    # The clock runs past every partition, with no sweeper to make new ones...
    await clock.advance(10 * DAY, partitions=False)
    assert await pool.fetchval(
        "SELECT evora.clock_now() > max(upper) FROM evora.event_partitions()"
    )
    with pytest.raises(asyncpg.PostgresError, match="no partition"):
        await cancel(store, ids[:1])
    # ...a retention round makes them: hourly ones here, three ahead of the clock
    sweeper = make_sweeper(event_partition_seconds=3600, event_partitions_ahead=3)
    await sweeper.prune_due()
    ahead = await pool.fetchval(
        "SELECT extract(epoch FROM max(upper) - evora.clock_now()) FROM evora.event_partitions()"
    )
    assert 3 * 3600 <= ahead < 4 * 3600
    await cancel(store, ids)
    newest = await pool.fetch(
        "SELECT name, lower, upper - lower AS width FROM evora.event_partitions()"
        " ORDER BY upper DESC LIMIT 3"
    )
    assert all(r["width"].total_seconds() == 3600 for r in newest)
    # named by their start, to the hour; one starting at midnight by its day alone (this
    # test used to assert an "..0000" ending and so failed from 21:00 to midnight UTC)
    starts = [r["lower"].astimezone(UTC) for r in newest]
    assert [r["name"] for r in newest] == [
        f"job_events_p{t:%Y%m%d}" + ("" if t.hour == 0 else f"_{t:%H}0000") for t in starts
    ]
    await sweeper.observe()
    assert sweeper._metrics.event_partitions_ahead._value.get() == pytest.approx(
        float(ahead), abs=60
    )


async def test_a_reader_of_the_partition_delays_its_drop_and_never_blocks_writers(
    make_sweeper: MakeSweeper,
    store: JobStore,
    pool: asyncpg.Pool,
    clock: Clock,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(retention_module, "PARTITION_LOCK_TIMEOUT_MS", 6000)
    later = (await submit(store, 5))[:3]
    await consumed(pool)
    await clock.advance(3 * DAY)
    old = await partition_of_first_event(pool)
    reader = await asyncpg.connect(db_url)
    try:
        # a long report over old history, holding its snapshot and a lock on the partition
        holding = reader.transaction(isolation="repeatable_read")
        await holding.start()
        twin = old.replace("job_events_p", "event_batches_p")  # the range's batches
        assert (
            await reader.fetchval(
                f"SELECT (SELECT count(*) FROM evora.{old})"
                f" + (SELECT coalesce(sum(cardinality(seqs)), 0) FROM evora.{twin})"
            )
            == 5
        )
        sweeper = make_sweeper()
        round_ = asyncio.create_task(sweeper.prune_due())

        async def detach_waits() -> bool:
            waiting: bool = await pool.fetchval(
                "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE query LIKE '%DETACH PARTITION%'"
                " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())"
            )
            return waiting

        await until(detach_waits, "the DETACH waiting for the reader", within=5)
        # writers go on while it waits: they never queue behind it
        await asyncio.wait_for(cancel(store, later), timeout=2.0)
        assert not round_.done()
        await round_  # gives up at the lock timeout, for this round
        # (an empty partition older than the window, like the one the template database's
        # migration made long before this test in a full run, may have gone in it)
        assert old in await partitions(pool)
        # its DETACH ... CONCURRENTLY stopped half way: new queries no longer see the
        # partition, and the next round must FINALIZE it
        # (the range's first table to go: its twin for the batches, which the reader read)
        pending = await pool.fetchval(
            "SELECT bool_or(detach_pending) FROM evora.event_tables() WHERE name IN ($1, $2)",
            old,
            twin,
        )
        assert pending is True
    finally:
        await reader.close()
    # the next round finishes what this one began
    assert (await make_sweeper().prune_due())["event_partitions"] >= 1
    assert old not in await partitions(pool)
    assert await event_count(pool) == 3


class _PausedAudit(asyncpg.Connection):  # type: ignore[misc]
    """A connection whose audit stops after its first batch of events (the cursor open, its
    range half read, its transaction holding its snapshot) until `resume` is set."""

    fetched: asyncio.Event
    resume: asyncio.Event

    async def fetch(self, query: str, *args: Any) -> Any:
        rows = await super().fetch(query, *args)
        if query == audit_module._NEXT_EVENTS and not self.fetched.is_set():
            self.fetched.set()
            await self.resume.wait()
        return rows


async def test_an_audit_between_two_fetches_delays_the_drop_a_round_and_sees_one_history(
    make_sweeper: MakeSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock, db_url: str
) -> None:
    """The auditor reads a range through a cursor, 1,000 events a fetch, in one REPEATABLE
    READ transaction. Stopped between two fetches while retention wants the partition it
    reads and writers append events: retention gives up for the round within its lock
    timeout, writers never wait, and the audit, resumed, reports the history of its
    snapshot exactly as an audit with nothing beside it; the next round drops the
    partition."""
    ids = [
        r.job["id"] for r in await store.submit_batch([JobSubmission(queue="q", type="t")] * 1500)
    ]
    await consumed(pool)
    await clock.advance(3 * DAY)
    old = await partition_of_first_event(pool)
    alone = await audit(db_url)
    assert alone.ok and alone.events == 1500, alone.text()

    conn = await asyncpg.connect(db_url, connection_class=_PausedAudit)
    assert isinstance(conn, _PausedAudit)
    conn.fetched, conn.resume = asyncio.Event(), asyncio.Event()
    try:
        paused = asyncio.create_task(audit(conn))
        await asyncio.wait_for(conn.fetched.wait(), 30)
        # writers append events (to the clock's partition) while the audit holds its cursor
        await asyncio.wait_for(cancel(store, ids[:50]), timeout=5.0)
        started = time.monotonic()
        removed = await asyncio.wait_for(make_sweeper().prune_due(), timeout=30)
        waited = time.monotonic() - started
        assert removed["event_partitions"] == 0 and old in await partitions(pool)
        print(f"retention round beside the paused audit: {waited:.2f} s")
        await asyncio.wait_for(cancel(store, ids[50:100]), timeout=5.0)
        conn.resume.set()
        report = await asyncio.wait_for(paused, 60)
    finally:
        conn.resume.set()
        await conn.close()
    assert report.as_json() == alone.as_json()
    assert (await make_sweeper().prune_due())["event_partitions"] >= 1
    assert old not in await partitions(pool)
    assert await event_count(pool) == 100
    after = await audit(db_url)
    assert after.ok and after.events == 100, after.text()


async def test_two_sweepers_at_once_with_writers_remove_each_partition_once(
    make_sweeper: MakeSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    # Natural races, autocommit statements only: two retention rounds (a sweeper that lost
    # its lock finishing its round beside the new leader) while transitions write events.
    ids = await submit(store, 20)
    await consumed(pool)
    old = await partition_of_first_event(pool)
    await clock.advance(3 * DAY)
    first, second = make_sweeper(), make_sweeper()
    rounds = await asyncio.gather(first.prune_due(), second.prune_due(), cancel(store, ids))
    removed = rounds[0]["event_partitions"] + rounds[1]["event_partitions"]
    if removed == 0:
        # Both rounds may give up together: each one's DETACH ... CONCURRENTLY waits for the
        # other's until the lock timeout, and each leaves the partition to its next round
        # (seen once in a whole-suite run). That next round, alone, removes it.
        removed = (await make_sweeper().prune_due())["event_partitions"]
    assert removed >= 1
    assert old not in await partitions(pool)
    # the writers' events are all there, in today's partition; the old one went whole
    assert await event_count(pool) == len(ids)


async def test_a_rebuild_silent_for_an_hour_no_longer_holds_a_partition_back(
    make_sweeper: MakeSweeper, store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    """A rebuild that died leaves its generation's progress row: once it has recorded nothing
    for ABANDONED_REBUILD_SECONDS, the active generation's next record removes it, and the
    partitions it held go; a rebuild that recorded lately, even at an old position (a slow
    one), still holds them. On 384d167 the abandoned row held them for ever."""
    before = await pool.fetchval("SELECT pg_current_snapshot()::text")
    await submit(store, 5)
    await consumed(pool, generation=1)
    # generation 3 records an old position after the clock moves (a slow rebuild, alive);
    # generation 2 recorded the same position before it (a rebuild that died)
    await record_projector_progress(pool, 2, before, False)
    await clock.advance(3 * DAY)
    await record_projector_progress(pool, 3, before, False)
    await consumed(pool, generation=1)
    generations = await pool.fetch("SELECT generation FROM evora.projector_progress ORDER BY 1")
    assert [r["generation"] for r in generations] == [1, 3]
    sweeper = make_sweeper()
    await sweeper.prune_due()
    assert await event_count(pool) == 5  # the slow rebuild holds them

    await clock.advance(ABANDONED_REBUILD_SECONDS + 60)
    await consumed(pool, generation=1)
    assert (await sweeper.prune_due())["event_partitions"] >= 1
    assert await event_count(pool) == 0
    # the slow rebuild, recording again, learns that its row was taken for abandoned
    assert not await record_projector_progress(pool, 3, before, False)
    assert await record_projector_progress(pool, 3, before, False)
