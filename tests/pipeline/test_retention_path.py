"""job_events stays append-only except for one narrow path: evora.drop_archived_events()
removes events that are archived (inside the watermark), consumed by every projector
generation and old enough, and nothing else can remove any event that is not archived.

The watermark is set by hand here, as a committed archive run would; the archive job
itself is tested in test_archive.py."""

from __future__ import annotations

import asyncpg
import pytest
from pymongo.asynchronous.database import AsyncDatabase

from evora.config import ConfigError, load_settings
from evora.protocol.jobs import JobSubmission
from evora.readmodels.layout import CONTROL, CONTROL_ID, Document
from evora.storage.jobs import JobStore
from evora.storage.retention import RetentionStore
from evora_services.projector.projector import Projector
from evora_services.projector.service import rebuild
from tests.projector.conftest import catch_up

DROP = "SELECT evora.drop_archived_events($1, $2, $3)"


async def submit(store: JobStore, n: int) -> None:
    """`n` events, each in a transaction of its own (so with increasing xids)."""
    for _ in range(n):
        await store.submit(JobSubmission(queue="q", type="t"))


async def mark_archived(pool: asyncpg.Pool, upto_seq: int, below_xid: str = "999999999") -> None:
    await pool.execute(
        "UPDATE evora.event_archive_watermark SET upto_seq = $1, below_xid = $2::text::xid8",
        upto_seq,
        below_xid,
    )


async def consumed_by_projector(pool: asyncpg.Pool, xid: str = "999999999") -> None:
    await pool.execute(
        "INSERT INTO evora.projector_progress (generation, xid, seq) VALUES (1, $1::text::xid8, 0)",
        xid,
    )


async def seqs(pool: asyncpg.Pool) -> list[int]:
    return [r["seq"] for r in await pool.fetch("SELECT seq FROM evora.job_events ORDER BY seq")]


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM evora.job_events",
        "DELETE FROM evora.job_events WHERE seq <= 3",
        "UPDATE evora.job_events SET event = 'x' WHERE seq = 1",
        "TRUNCATE evora.job_events",
    ],
)
async def test_plain_changes_are_rejected_even_for_archived_events(
    store: JobStore, pool: asyncpg.Pool, statement: str
) -> None:
    await submit(store, 5)
    await mark_archived(pool, 5)
    await consumed_by_projector(pool)
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
        await pool.execute(statement)
    assert await seqs(pool) == [1, 2, 3, 4, 5]


async def test_setting_the_flag_by_hand_still_cannot_remove_unarchived_events(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    await submit(store, 5)
    await mark_archived(pool, 2)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL evora.drop_archived_events = on")
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="event 3 is not archived"):
            await conn.execute("DELETE FROM evora.job_events WHERE seq <= 3")
    assert await seqs(pool) == [1, 2, 3, 4, 5]


async def test_the_function_refuses_to_go_past_the_watermark(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    await submit(store, 5)
    await consumed_by_projector(pool)
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="archive reaches only seq 0"):
        await pool.fetchval(DROP, 1, 0.0, 100)
    await mark_archived(pool, 3)
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="reaches only seq 3"):
        await pool.fetchval(DROP, 4, 0.0, 100)
    assert await seqs(pool) == [1, 2, 3, 4, 5]
    # events of transactions at or past the watermark's xid bound stay, whatever their seq
    first_xid = await pool.fetchval("SELECT xid::text FROM evora.job_events WHERE seq = 1")
    await mark_archived(pool, 3, first_xid)
    assert await pool.fetchval(DROP, 3, 0.0, 100) == 0
    await mark_archived(pool, 3)
    assert await pool.fetchval(DROP, 3, 0.0, 2) == 2  # in batches, oldest first
    assert await pool.fetchval(DROP, 3, 0.0, 100) == 1
    assert await seqs(pool) == [4, 5]


async def test_only_consumed_and_old_enough_events_go(store: JobStore, pool: asyncpg.Pool) -> None:
    await submit(store, 4)
    await mark_archived(pool, 4)
    # no projector has said how far it got: nothing is known to be consumed
    assert await pool.fetchval(DROP, 4, 0.0, 100) == 0
    third_xid = await pool.fetchval("SELECT xid::text FROM evora.job_events WHERE seq = 3")
    await consumed_by_projector(pool, third_xid)
    assert await pool.fetchval(DROP, 4, 3600.0, 100) == 0  # younger than an hour
    assert await pool.fetchval(DROP, 4, 0.0, 100) == 2
    assert await seqs(pool) == [3, 4]
    retention = RetentionStore(pool)
    await pool.execute("UPDATE evora.projector_progress SET xid = '999999999'")
    assert await retention.drop_archived_events(0.0, 100) == 2
    assert await seqs(pool) == []


async def test_projector_records_how_far_each_generation_consumed(
    store: JobStore, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    await submit(store, 30)
    projector = Projector(pool, mongo, 1, batch_size=7)
    await catch_up(projector)
    checkpoint = await projector.checkpoint()
    progress = await pool.fetch(
        "SELECT generation, xid::text::int8 AS xid, snapshot::text,"
        " pg_snapshot_xmin(snapshot)::text::int8 AS xmin FROM evora.projector_progress"
    )
    # the snapshot its spans reached, and its xmin: every event below it is consumed
    assert [(r["generation"], r["snapshot"], r["xid"]) for r in progress] == [
        (1, checkpoint["prev"], progress[0]["xmin"])
    ]
    newest = await pool.fetchval(
        "SELECT xid::text::int8 FROM evora.job_events ORDER BY xid DESC LIMIT 1"
    )
    assert progress[0]["xid"] > newest
    # a rebuild records its own progress while generation 1 is still the active one...
    generation, _ = await rebuild(pool, mongo)
    assert generation == 2
    control = await mongo[CONTROL].find_one({"_id": CONTROL_ID})
    assert control is not None and control["generation"] == 2
    rows = await pool.fetch("SELECT generation FROM evora.projector_progress ORDER BY 1")
    assert [r["generation"] for r in rows] == [1, 2]
    # ...and the first batch of the now active generation forgets the old one
    await submit(store, 1)
    await catch_up(Projector(pool, mongo, 2))
    rows = await pool.fetch("SELECT generation FROM evora.projector_progress ORDER BY 1")
    assert [r["generation"] for r in rows] == [2]


def test_events_window_is_at_least_an_hour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir("/")  # no stray .env file
    monkeypatch.delenv("EVORA_RETENTION_EVENTS_SECONDS", raising=False)
    assert load_settings().retention_events_seconds == 30 * 86_400
    monkeypatch.setenv("EVORA_RETENTION_EVENTS_SECONDS", "600")
    with pytest.raises(ConfigError, match="EVORA_RETENTION_EVENTS_SECONDS"):
        load_settings()
