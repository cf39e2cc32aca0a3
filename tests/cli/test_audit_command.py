"""`evora audit` (docs/audit.md): the auditor for operators, on a real database."""

from __future__ import annotations

import json

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import JobStore
from tests.cli.commands import evora


async def test_a_sound_history_exits_0_and_reports_every_check_as_json(
    db_url: str, store: JobStore
) -> None:
    job = (await store.submit(JobSubmission(queue="q", type="t"))).id
    [claimed] = await store.claim(worker_id="w", queues=["q"])
    await store.complete(job, claimed["lease_token"])

    result = evora("audit", "--json", env={"EVORA_DATABASE_URL": db_url})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["events"] == 3 and report["jobs"] == 1
    assert all(check["ok"] for check in report["checks"].values())
    assert "group_exclusive" in report["checks"]

    recent = evora("audit", "--since", "1h", env={"EVORA_DATABASE_URL": db_url})
    assert recent.returncode == 0, recent.stderr
    assert recent.stdout.startswith("audited 3 events of 1 jobs")


@pytest.mark.audit_skip(reason="the test breaks the history to see the command say so")
async def test_a_violation_exits_3_and_names_the_job(db_url: str, store: JobStore) -> None:
    job = (await store.submit(JobSubmission(queue="q", type="t"))).id
    conn = await asyncpg.connect(db_url)
    try:
        # a change no event records
        await conn.execute(
            "UPDATE evora.jobs SET state = 'CANCELLED', finished_at = now() WHERE id = $1", job
        )
    finally:
        await conn.close()

    result = evora("audit", env={"EVORA_DATABASE_URL": db_url})
    assert result.returncode == 3, result.stderr
    assert "FAIL ends_in_current_state: 1 violations" in result.stdout
    assert str(job) in result.stdout


def test_a_span_that_is_not_one_is_a_usage_error() -> None:
    result = evora("audit", "--since", "yesterday", env={"EVORA_DATABASE_URL": "postgresql://x"})
    assert result.returncode == 2
    assert "'yesterday' is not a span such as 90s, 15m, 1h or 7d" in result.stderr
