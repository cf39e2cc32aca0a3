"""`evora jobs`, `evora queues`, `evora dlq` against a real api: tables for people, JSON for
scripts, and exit statuses that say what happened."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from pymongo.asynchronous.database import AsyncDatabase

import evora
from evora.protocol.states import JobState
from evora.readmodels.layout import Document
from evora_services.cli.admin.exits import Exit
from tests.cli.commands import one_line
from tests.cli.conftest import ADMIN_TOKEN, WORKER_TOKEN, System
from tests.cli.forkserver import Forks
from tests.polling import until

# The waits for the worker and the projector ask the api in this process: each `evora` spawned
# costs most of a second of CPU, and a poll spawned it back to back for as long as it waited.
# The command itself then runs on what was waited for, and its output is checked as before.
# The commands are children forked from one interpreter that imported `evora` once (forkserver).


@pytest.fixture(scope="module")
def cli() -> Iterator[Forks]:
    forks = Forks()
    try:
        yield forks
    finally:
        forks.close()


async def test_jobs_list_get_events_cancel(cli: Forks, system: System) -> None:
    first = (await system.producer.submit("mail", "mail.send", {"to": "a"})).id
    second = (await system.producer.submit("mail", "mail.send", {"to": "b"})).id

    listed = await cli.evora("jobs", "list", "--queue", "mail", "--json", env=system.env())
    assert listed.returncode == Exit.OK, listed.stderr
    assert [job["id"] for job in json.loads(listed.stdout)["jobs"]] == [second, first]

    table = await cli.evora("jobs", "list", env=system.env())
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["ID", "QUEUE", "TYPE", "STATE", "ATTEMPT", "CREATED_AT"]
    # Whole ids, which people can tell apart and copy.
    assert [row.split()[:4] for row in rows] == [
        [second, "mail", "mail.send", "PENDING"],
        [first, "mail", "mail.send", "PENDING"],
    ]

    shown = await cli.evora("jobs", "get", first, env=system.env())
    assert shown.returncode == Exit.OK
    assert "state             PENDING" in shown.stdout

    cancelled = await cli.evora("jobs", "cancel", first, "--json", env=system.env())
    assert json.loads(cancelled.stdout)["jobs"][0]["state"] == "CANCELLED"
    events = await cli.evora("jobs", "events", first, "--json", env=system.env())
    assert [e["event"] for e in json.loads(events.stdout)["events"]] == ["submitted", "cancelled"]

    waited = await cli.evora("jobs", "get", second, "--wait", "0.2", env=system.env())
    assert waited.returncode == Exit.TIMED_OUT
    assert "state             PENDING" in waited.stdout
    # Said in words too, not only by the exit status.
    assert one_line(waited.stderr) == (
        f"evora jobs: job {second} is still PENDING after waiting 0.2 s (exit 8)"
    )
    cancelled_wait = await cli.evora("jobs", "get", first, "--wait", "1", env=system.env())
    assert cancelled_wait.returncode == Exit.JOB_FAILED
    assert one_line(cancelled_wait.stderr) == (
        f"evora jobs: job {first} ended CANCELLED, not COMPLETED (exit 7)"
    )


async def test_exit_statuses_say_what_happened(cli: Forks, system: System) -> None:
    job = (await system.producer.submit("mail", "mail.send")).id
    env = system.env()

    missing = await cli.evora("jobs", "get", str(uuid.uuid4()), env=env)
    assert missing.returncode == Exit.NOT_FOUND
    assert "job_not_found" in one_line(missing.stderr)

    not_in_dlq = await cli.evora("jobs", "retry", job, env=env)
    assert not_in_dlq.returncode == Exit.CONFLICT
    one_line(not_in_dlq.stderr)

    bad_token = await cli.evora("jobs", "list", env={**env, "EVORA_ADMIN_TOKEN": "x" * 20})
    assert bad_token.returncode == Exit.UNAUTHORIZED

    no_token = await cli.evora("jobs", "list", env={"EVORA_API_URL": system.api.url})
    assert no_token.returncode == Exit.USAGE
    assert one_line(no_token.stderr) == "evora: no token: set EVORA_ADMIN_TOKEN or pass --token"

    await system.api.close()
    down = await cli.evora("jobs", "list", env=env)
    assert down.returncode == Exit.UNREACHABLE
    one_line(down.stderr)


async def test_dlq_and_queues(cli: Forks, system: System) -> None:
    handlers = evora.Handlers()

    @handlers.job("bad.job")
    async def fail(job: evora.Job) -> None:
        raise evora.NonRetryable("broken")

    doomed = [(await system.producer.submit("work", "bad.job")).id for _ in range(3)]
    worker = evora.Worker(system.dispatcher.url, WORKER_TOKEN, ["work"], handlers=handlers)
    task = asyncio.create_task(worker.serve())
    env = system.env()

    async def dead_lettered() -> list[str]:
        result = await cli.evora("dlq", "list", "--queue", "work", "--json", env=env)
        return [job["id"] for job in json.loads(result.stdout)["jobs"]]

    async def all_dead() -> bool:
        async with evora.Client(system.api.url, ADMIN_TOKEN) as admin:
            page = await admin.list_jobs(queue="work", state=JobState.DLQ)
        return sorted(job["id"] for job in page.jobs) == sorted(doomed)

    try:
        await until(all_dead, "three jobs in the DLQ", within=30)
        assert sorted(await dead_lettered()) == sorted(doomed)
        await worker.stop()
        await task

        # Why each job is there: the reason of its move to the DLQ and its last error.
        listed = await cli.evora("dlq", "list", "--queue", "work", env=env)
        header, *rows = listed.stdout.splitlines()
        assert header.split() == [
            "ID",
            "QUEUE",
            "TYPE",
            "ATTEMPT",
            "FINISHED_AT",
            "REASON",
            "ERROR",
        ]
        assert sorted(row.split()[0] for row in rows) == sorted(doomed)
        for row in rows:
            assert row.split()[5:] == ["not_retryable", "NonRetryable:", "broken"], row
        as_json = await cli.evora("dlq", "list", "--queue", "work", "--json", env=env)
        assert {job["dlq_reason"] for job in json.loads(as_json.stdout)["jobs"]} == {
            "not_retryable"
        }

        retried = await cli.evora("dlq", "retry", doomed[0], env=env)
        assert retried.returncode == Exit.OK, retried.stderr
        assert retried.stdout.splitlines()[1].split()[:4] == [
            doomed[0],
            "work",
            "bad.job",
            "PENDING",
        ]
        discarded = await cli.evora("dlq", "discard", doomed[1], "--json", env=env)
        assert json.loads(discarded.stdout)["jobs"][0]["state"] == "CANCELLED"
        redriven = await cli.evora("queues", "redrive", "work", "--json", env=env)
        assert json.loads(redriven.stdout) == {"redriven": 1}
        assert await dead_lettered() == []

        paused = await cli.evora("queues", "pause", "work", env=env)
        assert paused.stdout.strip() == "queue work paused"

        async def shows_paused() -> bool:
            async with evora.Client(system.api.url, ADMIN_TOKEN) as admin:
                queues = {q["queue"]: q for q in await admin.queues()}
            return "work" in queues and queues["work"]["paused"] is True

        await until(shows_paused, "the read models show the queue paused", within=30)
        stats = await cli.evora("queues", "stats", "--json", env=env)
        assert {q["queue"]: q["paused"] for q in json.loads(stats.stdout)["queues"]}["work"]
        table = await cli.evora("queues", "stats", env=env)
        assert table.stdout.splitlines()[0].split() == [
            "QUEUE",
            "PAUSED",
            "WAITING",
            "PENDING",
            "RUNNING",
            "SUSPENDED",
            "COMPLETED",
            "DLQ",
            "CANCELLED",
        ]
        resumed = await cli.evora("queues", "resume", "work", "--json", env=env)
        assert json.loads(resumed.stdout) == {"queue": "work", "paused": False}
    finally:
        if not task.done():
            await worker.stop()
            await task


async def test_jobs_submit(cli: Forks, system: System) -> None:
    env = system.env()
    first = await cli.evora(
        "jobs", "submit", "mail", "mail.send", '{"to": "a"}', "--key", "k-1", "--json", env=env
    )
    assert first.returncode == Exit.OK, first.stderr
    job = json.loads(first.stdout)
    assert (job["queue"], job["type"], job["payload"], job["state"]) == (
        "mail",
        "mail.send",
        {"to": "a"},
        "PENDING",
    )
    again = await cli.evora(
        "jobs", "submit", "mail", "mail.send", '{"to": "a"}', "--key", "k-1", env=env
    )
    assert again.returncode == Exit.OK, again.stderr
    assert again.stdout.startswith("replayed: the job this key made before\n")
    assert f"id                {job['id']}" in again.stdout

    not_json = await cli.evora("jobs", "submit", "mail", "mail.send", "{to: a}", env=env)
    assert not_json.returncode == Exit.USAGE
    assert "not JSON" in not_json.stderr

    handlers = evora.Handlers()

    @handlers.job("echo")
    async def echo(job: evora.Job) -> object:
        return job.payload

    worker = evora.Worker(system.dispatcher.url, WORKER_TOKEN, ["work"], handlers=handlers)
    task = asyncio.create_task(worker.serve())
    try:
        done = await cli.evora(
            "jobs", "submit", "work", "echo", '{"n": 1}', "--priority", "5", "--wait", "30", env=env
        )
        assert done.returncode == Exit.OK, done.stderr
        assert "state             COMPLETED" in done.stdout
        assert 'result            {"n":1}' in done.stdout
    finally:
        await worker.stop()
        await task


async def test_schedules_and_limits(cli: Forks, system: System) -> None:
    env = system.env()
    put = await cli.evora(
        "schedules", "put", "nightly", "0 9 * * 1-5", "reports", "report.build", '{"k": 1}',
        "--timezone", "Europe/Berlin", "--json", env=env,
    )  # fmt: skip
    assert put.returncode == Exit.OK, put.stderr
    assert json.loads(put.stdout)["job"]["payload"] == {"k": 1}
    listed = await cli.evora("schedules", "list", env=env)
    header, row = listed.stdout.splitlines()
    assert header.split() == ["NAME", "CRON", "TIMEZONE", "QUEUE", "TYPE", "PAUSED", "NEXT_RUN_AT"]
    assert row.startswith("nightly  0 9 * * 1-5  Europe/Berlin  reports  report.build  False")
    triggered = await cli.evora("schedules", "trigger", "nightly", "--json", env=env)
    assert json.loads(triggered.stdout)["type"] == "report.build"
    paused = await cli.evora("schedules", "pause", "nightly", env=env)
    assert paused.stdout.strip() == "schedule nightly paused"
    deleted = await cli.evora("schedules", "delete", "nightly", env=env)
    assert deleted.returncode == Exit.OK
    gone = await cli.evora("schedules", "get", "nightly", env=env)
    assert gone.returncode == Exit.NOT_FOUND

    limit = await cli.evora(
        "limits",
        "set",
        "tenant:*",
        "--concurrency",
        "2",
        "--rate",
        "10/60",
        "--max-pending",
        "100",
        env=env,
    )
    assert limit.returncode == Exit.OK, limit.stderr
    assert "rate         10/60s" in limit.stdout
    assert "max_pending  100" in limit.stdout
    usage = await cli.evora("limits", "get", "tenant:42", "--json", env=env)
    assert json.loads(usage.stdout)["governed_by"] == "tenant:*"
    assert (json.loads(usage.stdout)["pending"], json.loads(usage.stdout)["room"]) == (0, 100)
    bad_rate = await cli.evora("limits", "set", "tenant:*", "--rate", "ten", env=env)
    assert bad_rate.returncode == Exit.USAGE
    assert "a rate is N/SECONDS" in bad_rate.stderr
    await cli.evora("limits", "delete", "tenant:*", env=env)
    assert (await cli.evora("limits", "list", env=env)).stdout.strip() == "no limits"


async def test_analytics(cli: Forks, system: System, mongo: AsyncDatabase[Document]) -> None:
    await system.producer.submit("mail", "mail.send")
    env = system.env()

    async def projected() -> bool:
        async with evora.Client(system.api.url, ADMIN_TOKEN) as admin:
            found = await admin.analytics()
        return any(queue["queue"] == "mail" for queue in found["queues"])

    # before any pipeline run: the one command to run, and the live totals alone
    await until(projected, "the projector to see queue mail")
    before = await cli.evora("analytics", env=env)
    assert before.returncode == Exit.OK, before.stderr
    hint, caption, header, row = before.stdout.splitlines()
    assert caption == "totals as pipeline/live:"
    assert "the pipeline has not run yet: `evora pipeline run`" in hint
    assert header.split() == [
        "QUEUE",
        "SUBMITTED",
        "COMPLETED",
        "FAILED",
        "DEAD_LETTERED",
        "RETRIED",
        "LEASE_EXPIRED",
        "AGREE",
    ]
    assert row.split() == ["mail", "-/1", "-/0", "-/0", "-/0", "-/0", "-/0", "NO"]

    totals = dict.fromkeys(["submitted", "completed", "failed", "dead_lettered"], 0)
    totals |= {"submitted": 1, "retried": 0, "lease_expired": 0}
    as_of = {"run_id": "r1", "at": datetime(2026, 11, 29, tzinfo=UTC), "events": 1, "seq": 1}
    await mongo["analytics_queue_totals"].insert_one(
        {"_id": "mail", "totals": totals, "by_event": {"submitted": 1}, "events": 1, "run_id": "r1"}
        | {"as_of": {**as_of, "below_xid": 1, "archive": {}}}
    )
    after = await cli.evora("analytics", env=env)
    first, _, _, row = after.stdout.splitlines()
    assert first.startswith("pipeline run r1 at 2026-11-29T00:00:00Z: 1 events, seq up to 1")
    assert row.split() == ["mail", "1/1", "0/0", "0/0", "0/0", "0/0", "0/0", "yes"]
    as_json = await cli.evora("analytics", "--json", env=env)
    found = json.loads(as_json.stdout)
    assert found["ran"] is True and [q["agree"] for q in found["queues"]] == [True]

    # per job type
    mail_send = {"queue": "mail", "type": "mail.send"}
    await mongo["analytics_rates"].insert_one(
        {"_id": "mail/mail.send", **mail_send, "jobs": 1, "retried_jobs": 0, "retries": 0}
        | {"dead_lettered_jobs": 0, "retry_rate": 0.0, "dlq_rate": 0.0}
    )
    await mongo["analytics_failure_reasons"].insert_one(
        {"_id": "mail/mail.send/1", **mail_send, "rank": 1, "error_type": "SMTPError"}
        | {"message": "550 mailbox full", "failures": 2, "last_at": as_of["at"]}
    )
    per_type = await cli.evora("analytics", "mail", env=env)
    assert per_type.returncode == Exit.OK, per_type.stderr
    header, row_line = per_type.stdout.splitlines()
    assert header.split() == [
        "TYPE",
        "JOBS",
        "RETRY_RATE",
        "DLQ_RATE",
        "WAIT_P95_MS",
        "RUN_P95_MS",
        "TOP_FAILURE",
    ]
    cells = ["mail.send", "1", "0.0", "0.0", "-", "-", "SMTPError: 550 mailbox full"]
    assert re.split(r"\s{2,}", row_line) == cells
    nothing = await cli.evora("analytics", "other", env=env)
    assert nothing.stdout.strip() == "queue other had no event in the latest pipeline run"
