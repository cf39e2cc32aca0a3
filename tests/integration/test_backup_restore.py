"""A backup is PostgreSQL alone (docs/deploy.md, Backup and restore): a `pg_dump` of a
database with jobs in every state, restored into a fresh database, is what this code expects
(`evora migrate --check`), and the queue resumes on it: the running job completes with the
lease token it held, the job waiting for it becomes claimable, and the audit passes."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from evora.embedded._pgbin import find_bin_dir
from evora.protocol.jobs import JobSubmission
from evora.protocol.states import JobState
from evora.storage.audit import audit
from evora.storage.db import create_pool
from evora.storage.jobs import Failure, JobStore
from evora.storage.rows import JobDict
from tests.cli.commands import evora_async


async def _submitted_and_claimed(store: JobStore, queue: str) -> JobDict:
    await store.submit(JobSubmission(queue=queue, type="t"))
    [job] = await store.claim(worker_id="w", queues=[queue])
    return job


def _dump_and_restore(source: str, target: str, file: Path) -> None:
    bin_dir = find_bin_dir()
    for command in (
        [str(bin_dir / "pg_dump"), "--format=custom", "--file", str(file), "--dbname", source],
        [str(bin_dir / "pg_restore"), "--exit-on-error", "--dbname", target, str(file)],
    ):
        subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)


async def test_a_restored_dump_is_current_and_the_queue_resumes_on_it(
    db_url: str, store: JobStore, empty_db_url: str, tmp_path: Path
) -> None:
    done = await _submitted_and_claimed(store, "done")
    await store.complete(done["id"], done["lease_token"], {"ok": True})
    dead = await _submitted_and_claimed(store, "dead")
    await store.fail(Failure(dead["id"], dead["lease_token"], "boom", retryable=False))
    cancelled = (await store.submit(JobSubmission(queue="gone", type="t"))).id
    await store.cancel(cancelled)
    running = await _submitted_and_claimed(store, "run")
    waiting = (
        await store.submit(JobSubmission(queue="wait", type="t", depends_on=[running["id"]]))
    ).id
    pending = (await store.submit(JobSubmission(queue="todo", type="t"))).id
    later = (await store.submit(JobSubmission(queue="todo", type="t", delay_seconds=3600))).id
    states = {
        done["id"]: JobState.COMPLETED,
        dead["id"]: JobState.DLQ,
        cancelled: JobState.CANCELLED,
        running["id"]: JobState.RUNNING,
        waiting: JobState.WAITING,
        pending: JobState.PENDING,
        later: JobState.PENDING,
    }
    assert {j: (await store.get(j))["state"] for j in states} == states

    await asyncio.to_thread(_dump_and_restore, db_url, empty_db_url, tmp_path / "evora.dump")

    check = await evora_async("migrate", "--check", env={"EVORA_DATABASE_URL": empty_db_url})
    assert check.returncode == 0, check.stdout + check.stderr
    pool = await create_pool(empty_db_url)
    restored = JobStore(pool)
    try:
        assert {j: (await restored.get(j))["state"] for j in states} == states
        await restored.complete(running["id"], running["lease_token"], None)
        for queue, job in (("wait", waiting), ("todo", pending)):
            [claimed] = await restored.claim(worker_id="w2", queues=[queue], max_jobs=5)
            assert claimed["id"] == job
            await restored.complete(job, claimed["lease_token"], None)
        assert (await restored.get(later))["state"] == JobState.PENDING
        report = await audit(empty_db_url)
        assert report.ok, report.text()
    finally:
        await restored.close()
        await pool.close()
