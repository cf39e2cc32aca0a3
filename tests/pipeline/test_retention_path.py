"""job_events stays append-only: no UPDATE, DELETE or TRUNCATE of its rows, through the
parent or a partition. Retention removes whole partitions (tests/sweeper/
test_event_partitions.py), and the previous release's row-by-row path removes nothing.

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
        # the outbox's two tables (migration 0064); a view is never truncated
        "DELETE FROM evora.event_batches",
        "TRUNCATE evora.event_batches",
        "TRUNCATE evora.job_event_rows",
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


@pytest.mark.audit_skip(reason="the test writes an event of its own through the view")
async def test_a_partition_is_append_only_too(store: JobStore, pool: asyncpg.Pool) -> None:
    # the statement names the partition, not job_events: its rows have the parent's triggers,
    # in both tables of the outbox (migration 0064: a submission's events are a batch; an
    # event written through the view is a row)
    await submit(store, 3)
    await pool.execute(
        "INSERT INTO evora.job_events (job_id, job_version, queue, type, event, to_state,"
        " attempt, at, job) SELECT id, version, queue, type, 'debounced', state, 0, now(),"
        " evora.job_image(j) FROM evora.jobs j LIMIT 1"
    )
    await mark_archived(pool, 4)
    await consumed_by_projector(pool)
    for table, column in (("job_event_rows", "event"), ("event_batches", "events")):
        partition = await pool.fetchval(
            f"SELECT tableoid::regclass::text FROM evora.{table} LIMIT 1"
        )
        value = "'x'" if column == "event" else "'{x}'"
        for statement in (f"DELETE FROM {partition}", f"UPDATE {partition} SET {column} = {value}"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="append-only"):
                await pool.execute(statement)
    assert await seqs(pool) == [1, 2, 3, 4]


async def test_the_previous_releases_delete_removes_nothing(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    # its sweeper calls it while it is rolled; events go by whole partitions now
    await submit(store, 3)
    await mark_archived(pool, 3)
    await consumed_by_projector(pool)
    assert await pool.fetchval(DROP, 3, 0.0, 100) == 0
    assert await seqs(pool) == [1, 2, 3]


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


def test_events_window_is_at_least_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir("/")  # no stray .env file
    monkeypatch.delenv("EVORA_RETENTION_EVENTS_SECONDS", raising=False)
    monkeypatch.delenv("EVORA_ARCHIVE_EVENTS", raising=False)
    settings = load_settings()
    assert settings.retention_events_seconds == 30 * 86_400
    assert settings.archive_events is False
    monkeypatch.setenv("EVORA_RETENTION_EVENTS_SECONDS", "59")
    with pytest.raises(ConfigError, match="EVORA_RETENTION_EVENTS_SECONDS"):
        load_settings()
