"""Jobs through the whole system: `Client` submits to the api, `Worker`s claim from the
dispatcher and run handlers, PostgreSQL records every step."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

from evora import Handlers, Job, Submission
from tests.e2e.conftest import Stack


async def test_batch_of_jobs_of_several_types_completes_with_handler_results(
    stack: Stack,
) -> None:
    queue = "e2e-happy"
    handlers = Handlers()
    runs: Counter[str] = Counter()

    @handlers.job("calc.add")
    async def add(job: Job) -> int:
        runs[job.id] += 1
        await asyncio.sleep(0)  # a real await inside, as handlers do
        return int(job.payload["a"]) + int(job.payload["b"])

    @handlers.job("text.upper")
    async def upper(job: Job) -> dict[str, str]:
        runs[job.id] += 1
        return {"text": str(job.payload["text"]).upper()}

    @handlers.job("echo.payload")
    async def echo(job: Job) -> Any:
        runs[job.id] += 1
        return job.payload

    submissions: list[Submission] = []
    expected: list[Any] = []
    for i in range(200):
        kind = i % 3
        if kind == 0:
            submissions.append({"queue": queue, "type": "calc.add", "payload": {"a": i, "b": 7}})
            expected.append(i + 7)
        elif kind == 1:
            text = f"job nr {i} \u00e9\u00df"
            submissions.append({"queue": queue, "type": "text.upper", "payload": {"text": text}})
            expected.append({"text": text.upper()})
        else:
            payload = {"i": i, "nested": [None, True, 1.5, "x"], "nul": "a\u0001b"}
            submissions.append({"queue": queue, "type": "echo.payload", "payload": payload})
            expected.append(payload)

    results = await stack.client.submit_batch(submissions)
    assert len(results) == 200
    assert not any(r.replayed for r in results)
    assert {r.job["state"] for r in results} == {"PENDING"}
    ids = [r.id for r in results]

    worker = stack.worker(handlers, [queue], concurrency=8)
    stack.start(worker)
    await stack.wait_for_states(queue, {"COMPLETED": 200}, within=60)

    # Every handler ran exactly once: no failure happened, so nothing ran twice.
    assert runs == Counter({job_id: 1 for job_id in ids})

    # All 200 share one submission transaction; paging through them in odd-sized pages
    # must still give each exactly once.
    listed = [job async for job in stack.admin.iter_jobs(queue=queue, page_size=37)]
    by_id = {job["id"]: job for job in listed}
    assert len(listed) == 200 and set(by_id) == set(ids)
    for job_id, submission, result in zip(ids, submissions, expected, strict=True):
        job = by_id[job_id]
        assert job["state"] == "COMPLETED"
        assert job["type"] == submission["type"]
        assert job["result"] == result, job
        assert job["attempt"] == 1
        assert job["last_error"] is None
        assert job["worker_id"] == worker.settings.worker_id
        assert job["started_at"] is not None and job["finished_at"] is not None

    histories = await asyncio.gather(*(stack.client.events(job_id) for job_id in ids))
    for job_id, events in zip(ids, histories, strict=True):
        assert [e["event"] for e in events] == ["submitted", "claimed", "completed"], events
        assert [(e["from_state"], e["to_state"]) for e in events] == [
            (None, "PENDING"),
            ("PENDING", "RUNNING"),
            ("RUNNING", "COMPLETED"),
        ]
        seqs = [e["seq"] for e in events]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3
        assert [e["attempt"] for e in events] == [0, 1, 1]
        assert {e["job_id"] for e in events} == {job_id}
        assert events[1]["worker_id"] == worker.settings.worker_id
        moments = [datetime.fromisoformat(e["at"]) for e in events]
        assert moments == sorted(moments)


async def test_fifo_groups_over_http_run_one_at_a_time_in_submission_order(
    stack: Stack,
) -> None:
    queue = "e2e-fifo"
    groups, per_group = 10, 10
    handlers = Handlers()
    running: Counter[int] = Counter()
    overlaps: list[tuple[int, int]] = []
    started: dict[int, list[int]] = defaultdict(list)
    ended: dict[int, list[int]] = defaultdict(list)
    busy = 0
    peak = 0

    @handlers.job("fifo.step")
    async def step(job: Job) -> dict[str, int]:
        nonlocal busy, peak
        group, seq = int(job.payload["group"]), int(job.payload["seq"])
        if running[group]:
            overlaps.append((group, seq))
        running[group] += 1
        busy += 1
        peak = max(peak, busy)
        started[group].append(seq)
        try:
            # Yield for a while so that other jobs (of other groups) do run meanwhile.
            for _ in range(3):
                await asyncio.sleep(0.002)
            return {"group": group, "seq": seq}
        finally:
            ended[group].append(seq)
            running[group] -= 1
            busy -= 1

    # Submission order interleaves the groups: seq 0 of every group, then seq 1, ...
    submissions: list[Submission] = [
        {
            "queue": queue,
            "type": "fifo.step",
            "group_key": f"group-{group}",
            "payload": {"group": group, "seq": seq},
        }
        for seq in range(per_group)
        for group in range(groups)
    ]
    results = await stack.client.submit_batch(submissions)
    workers = [stack.worker(handlers, [queue], concurrency=4) for _ in range(3)]
    for worker in workers:
        stack.start(worker)
    await stack.wait_for_states(queue, {"COMPLETED": groups * per_group}, within=90)

    assert overlaps == [], "two jobs of one group ran at the same time"
    for group in range(groups):
        assert started[group] == list(range(per_group)), (group, started[group])
        assert ended[group] == list(range(per_group)), (group, ended[group])
    assert peak > 1, "jobs of different groups should have run concurrently"

    # The same, as PostgreSQL recorded it: per group, each claim follows the completion
    # of the group's previous job, in submission order.
    seq_of = {r.id: (i // groups) for i, r in enumerate(results)}
    rows = await stack.pool.fetch(
        """SELECT e.job_id::text AS job_id, e.event, j.group_key
           FROM evora.job_events e JOIN evora.jobs j ON j.id = e.job_id
           WHERE e.queue = $1 AND e.event IN ('claimed', 'completed')
           ORDER BY e.seq""",
        queue,
    )
    timeline: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for row in rows:
        timeline[row["group_key"]].append((row["event"], seq_of[row["job_id"]]))
    assert len(timeline) == groups
    for group_key, entries in timeline.items():
        expected = [(event, seq) for seq in range(per_group) for event in ("claimed", "completed")]
        assert entries == expected, group_key
    # Claimed by these workers only.
    claimed_by = await stack.pool.fetch(
        "SELECT DISTINCT worker_id FROM evora.job_events WHERE queue = $1 AND event = 'claimed'",
        queue,
    )
    assert {row["worker_id"] for row in claimed_by} <= {w.settings.worker_id for w in workers}
