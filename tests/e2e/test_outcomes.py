"""How handler outcomes other than a plain result end up, end to end: retries with backoff,
non-retryable failures, and results the dispatcher cannot store. None may leave a job
stuck RUNNING, and one bad outcome must not sink the others reported with it."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from evora import Handlers, Job, NonRetryable, Submission
from tests.e2e.conftest import Stack

HUGE = 1024 * 1024 + 16  # past the default EVORA_MAX_PAYLOAD_BYTES once encoded


async def test_failures_retries_and_unstorable_results(stack: Stack) -> None:
    queue = "e2e-outcomes"
    handlers = Handlers()
    attempts: Counter[str] = Counter()

    @handlers.job("outcome")
    async def outcome(job: Job) -> Any:
        attempts[job.payload["kind"]] += 1
        await asyncio.sleep(0)
        kind = job.payload["kind"]
        if kind == "flaky" and job.attempt == 1:
            raise ConnectionError("downstream timed out")
        if kind == "fatal":
            raise NonRetryable("cannot ever work")
        if kind == "nul":
            return {"text": "a\x00b"}  # PostgreSQL's jsonb cannot hold U+0000
        if kind == "huge":
            return "x" * HUGE
        if kind == "unserialisable":
            return {1, 2, 3}
        return {"kind": kind}

    kinds = ["ok", "flaky", "fatal", "nul", "huge", "unserialisable", "ok2"]
    submissions: list[Submission] = [
        {
            "queue": queue,
            "type": "outcome",
            "payload": {"kind": kind},
            "max_attempts": 3,
            "backoff": {"initial_seconds": 0.1, "max_seconds": 0.2, "multiplier": 1},
        }
        for kind in kinds
    ]
    ids = dict(
        zip(kinds, (r.id for r in await stack.client.submit_batch(submissions)), strict=True)
    )
    stack.start(stack.worker(handlers, [queue], concurrency=len(kinds)))
    await stack.wait_for_states(queue, {"COMPLETED": 3, "DLQ": 4}, within=30)

    jobs = {kind: await stack.client.get(job_id) for kind, job_id in ids.items()}
    assert jobs["ok"]["result"] == {"kind": "ok"}
    assert jobs["ok2"]["result"] == {"kind": "ok2"}

    flaky = jobs["flaky"]
    assert flaky["state"] == "COMPLETED" and flaky["attempt"] == 2
    assert flaky["result"] == {"kind": "flaky"}
    # the handler's stack trace travels with the failure, down to the line that raised
    trace = flaky["last_error"].pop("traceback")
    assert 'in outcome\n    raise ConnectionError("downstream timed out")' in trace
    assert flaky["last_error"] == {"message": "downstream timed out", "type": "ConnectionError"}
    assert await stack.event_names(ids["flaky"]) == [
        "submitted",
        "claimed",
        "failed",
        "claimed",
        "completed",
    ]

    fatal = jobs["fatal"]
    assert fatal["state"] == "DLQ" and fatal["attempt"] == 1
    assert fatal["last_error"].pop("traceback").endswith("NonRetryable: cannot ever work\n")
    assert fatal["last_error"] == {"message": "cannot ever work", "type": "NonRetryable"}
    events = await stack.client.events(ids["fatal"])
    assert [e["event"] for e in events] == ["submitted", "claimed", "dead_lettered"]
    assert events[-1]["data"]["reason"] == "not_retryable"

    # Results that cannot be stored: the handler ran once, the job is dead-lettered with
    # a reason instead of staying RUNNING (or being re-run forever).
    for kind, words in [
        ("nul", "rejected the result"),
        ("huge", "rejected the result"),
        ("unserialisable", "not JSON-serialisable"),
    ]:
        job = jobs[kind]
        assert job["state"] == "DLQ", job
        assert job["attempt"] == 1
        assert job["result"] is None
        assert words in job["last_error"]["message"], job["last_error"]
        assert await stack.event_names(ids[kind]) == ["submitted", "claimed", "dead_lettered"]
        assert attempts[kind] == 1

    assert attempts["flaky"] == 2
    assert attempts["ok"] == attempts["ok2"] == attempts["fatal"] == 1
