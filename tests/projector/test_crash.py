"""A projector killed with SIGKILL at random moments, again and again, while a mixed
workload runs, still leaves read models exactly equal to PostgreSQL once it catches up."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
from pymongo.asynchronous.database import AsyncDatabase

from evora.readmodels.layout import CONTROL, Document, checkpoint_id
from evora.storage.jobs import JobStore
from tests.projector.conftest import truth
from tests.projector.test_projection import assert_matches_truth
from tests.projector.workload import mixed_workload

KILLS = 4


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(db_url: str, mongo_url: str, mongo_db: str, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "EVORA_DATABASE_URL": db_url,
        "EVORA_MONGO_URL": mongo_url,
        "EVORA_MONGO_DB": mongo_db,
        "EVORA_AUTH": "disabled",
        "EVORA_PROJECTOR_PORT": str(_free_port()),
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "evora_services.cli", "projector"],
            env=env,
            stdout=out,
            stderr=out,
        )


async def test_sigkilled_projector_converges_to_the_truth(
    db_url: str,
    mongo_url: str,
    mongo_db_name: str,
    store: JobStore,
    pool: asyncpg.Pool,
    mongo: AsyncDatabase[Document],
    tmp_path: Path,
) -> None:
    log = tmp_path / "projector.log"
    rng = random.Random(2026)
    process = _start(db_url, mongo_url, mongo_db_name, log)
    kills = 0

    async def killer() -> None:
        nonlocal process, kills
        while kills < KILLS:
            await asyncio.sleep(rng.uniform(0.3, 1.5))
            process.send_signal(signal.SIGKILL)
            process.wait(10)
            kills += 1
            process = _start(db_url, mongo_url, mongo_db_name, log)

    async def progress() -> int:
        checkpoint = await mongo[CONTROL].find_one({"_id": checkpoint_id(1)})
        return int(checkpoint["max_seq"]) if checkpoint else 0

    try:
        await asyncio.gather(
            mixed_workload(store, pool, jobs=5000, queues=["q1", "q2", "q3", "q4"], seed=99),
            killer(),
        )
        newest = (await truth(pool))[2]
        # More kills while it catches up: each one after the projector has visibly applied
        # something since its restart, at a random point of its work.
        for _ in range(KILLS):
            seen = await progress()
            deadline = time.monotonic() + 60
            while await progress() == seen and seen < newest:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                await asyncio.sleep(0.05)
            if seen >= newest:
                break
            await asyncio.sleep(rng.uniform(0.0, 0.4))
            process.send_signal(signal.SIGKILL)
            process.wait(10)
            kills += 1
            process = _start(db_url, mongo_url, mongo_db_name, log)
        # the workload phase always kills KILLS times; catch-up kills happen only while a
        # backlog remains, which a fast catch-up may not leave
        assert kills >= KILLS
        deadline = time.monotonic() + 180
        while await progress() != newest:
            assert process.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "projector did not catch up"
            await asyncio.sleep(0.2)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
    _, totals, _ = await truth(pool)
    assert sum(sum(t.values()) for t in totals.values()) > 15_000  # a real workload ran
    assert {
        "completed",
        "failed",
        "dead_lettered",
        "lease_expired",
        "cancelled",
        "released",
        "retried",
    } <= {name for t in totals.values() for name in t}
    await assert_matches_truth(pool, mongo)
