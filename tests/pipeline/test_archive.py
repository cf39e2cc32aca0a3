"""The archive holds every archivable event exactly once: re-running adds nothing, and a run
killed after writing its files but before committing its watermark loses nothing and
duplicates nothing once the next run has gone through."""

from __future__ import annotations

import argparse
import asyncio

import asyncpg
import pytest
from pymongo.asynchronous.database import AsyncDatabase
from pyspark.sql import SparkSession

from evora.config import Settings
from evora.readmodels.layout import Document
from evora.storage.jobs import JobStore
from evora_services.cli import _parser
from evora_services.pipeline.control import ControlDB
from evora_services.pipeline.events import EVENT_COLUMNS, MAX_SEQ, Rectangle
from evora_services.pipeline.main import run_command
from evora_services.pipeline.run import LiveSlice, read_history
from evora_services.projector.projector import Projector
from tests.pipeline.conftest import Pipeline
from tests.projector.conftest import catch_up
from tests.projector.workload import mixed_workload

QUEUES = ["alpha", "beta"]


class Killed(Exception):
    """Stands in for SIGKILL between publishing the files and committing the watermark."""


async def archivable_seqs(pool: asyncpg.Pool, upto_seq: int, below_xid: int) -> list[int]:
    rows = await pool.fetch(
        "SELECT seq FROM evora.job_events WHERE seq <= $1 AND xid < $2::text::xid8 ORDER BY seq",
        upto_seq,
        str(below_xid),
    )
    return [r["seq"] for r in rows]


async def test_archiving_twice_changes_nothing(
    pipeline: Pipeline,
    spark: SparkSession,
    store: JobStore,
    pool: asyncpg.Pool,
    mongo: AsyncDatabase[Document],
    db_url: str,
) -> None:
    await mixed_workload(store, pool, jobs=500, queues=QUEUES, seed=5)
    projector = Projector(pool, mongo, 1)
    await catch_up(projector)
    first = await pipeline.archive()
    assert first.run_id is not None
    rows = await pipeline.archived_rows()
    files = pipeline.store.files()
    assert [r["seq"] for r in rows] == await archivable_seqs(
        pool, first.watermark.upto_seq, first.watermark.below_xid
    )
    assert len(rows) == first.events and set(first.partitions) == {str(r["date"]) for r in rows}

    # the same run again, through the command line this time
    args = _parser().parse_args(["pipeline", "archive", "--older-than", "0s"])
    settings = Settings(database_url=db_url, archive_url=str(pipeline.root))
    assert await asyncio.to_thread(run_command, args, settings, spark) == 0
    assert await pipeline.archived_rows() == rows
    assert pipeline.store.files() == files
    assert (await pipeline.watermark()).rectangle == first.watermark

    # new events: the next run adds exactly them
    await mixed_workload(store, pool, jobs=200, queues=QUEUES, seed=6)
    await catch_up(projector)
    second = await pipeline.archive()
    assert second.run_id is not None and second.watermark.contains(first.watermark)
    everything = await pipeline.archived_rows()
    assert [r["seq"] for r in everything] == await archivable_seqs(
        pool, second.watermark.upto_seq, second.watermark.below_xid
    )
    assert len(everything) == first.events + second.events
    assert (await pipeline.watermark()).archived == len(everything)
    # rows are the events as PostgreSQL holds them
    sample = everything[-1]
    event = await pool.fetchrow("SELECT * FROM evora.job_events WHERE seq = $1", sample["seq"])
    assert event is not None
    assert (sample["job_id"], sample["event"], sample["at"].replace(tzinfo=None)) == (
        str(event["job_id"]),
        event["event"],
        event["at"].replace(tzinfo=None),
    )


async def test_run_killed_before_its_commit_loses_and_duplicates_nothing(
    pipeline: Pipeline,
    spark: SparkSession,
    store: JobStore,
    pool: asyncpg.Pool,
    mongo: AsyncDatabase[Document],
    db_url: str,
) -> None:
    await mixed_workload(store, pool, jobs=500, queues=QUEUES, seed=8)
    await catch_up(Projector(pool, mongo, 1))
    total = await pool.fetchval("SELECT count(*) FROM evora.job_events")

    def kill(run_id: str) -> None:
        raise Killed(run_id)

    with pytest.raises(Killed) as killed:
        await pipeline.archive(before_commit=kill)
    run_id = str(killed.value)
    # its files are in the archive, but nothing says they count
    leftovers = [f for f in pipeline.store.files() if f.run_id == run_id]
    assert leftovers
    mark = await pipeline.watermark()
    assert mark.rectangle == Rectangle() and mark.archived == 0

    # readers meanwhile see each event once: the leftovers are outside the watermark
    def history_seqs() -> tuple[int, int]:
        with ControlDB(db_url) as control:
            mark = control.watermark()
            live = LiveSlice.measure(control, mark.rectangle, Rectangle(MAX_SEQ, control.horizon()))
        df = read_history(spark, pipeline.source(), pipeline.store, mark, live)
        assert df.columns == list(EVENT_COLUMNS)
        row = df.selectExpr("count(*) AS n", "count(DISTINCT seq) AS seqs").first()
        assert row is not None
        return int(row["n"]), int(row["seqs"])

    assert await asyncio.to_thread(history_seqs) == (total, total)

    # the next run removes the leftovers and archives the same events, once
    again = await pipeline.archive()
    assert again.run_id is not None and again.removed_leftovers == len(leftovers)
    rows = await pipeline.archived_rows()
    seqs = [r["seq"] for r in rows]
    assert len(seqs) == len(set(seqs)) == again.events
    assert seqs == await archivable_seqs(pool, again.watermark.upto_seq, again.watermark.below_xid)
    assert not any(f.run_id == run_id for f in pipeline.store.files())
    assert not pipeline.store.exists(pipeline.store.staging_url(run_id))
    assert await asyncio.to_thread(history_seqs) == (total, total)


def test_the_command_line_lists_the_pipeline_jobs() -> None:
    parser = _parser()
    help_text = parser.format_help()
    assert "pipeline" in help_text
    args = parser.parse_args(["pipeline", "run", "--no-mongo", "--master", "local[1]"])
    assert isinstance(args, argparse.Namespace)
    assert (args.pipeline_command, args.no_mongo, args.master) == ("run", True, "local[1]")
