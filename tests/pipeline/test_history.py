"""On a generated history, part archived and removed from PostgreSQL through the retention
path and part live, `pipeline run` counts every event exactly once: its per-queue totals
equal the projector's read models and a plain SQL count, queue by queue; and the api's
GET /v1/analytics serves them so, beside the projector's."""

from __future__ import annotations

from collections import Counter

import aiohttp
import asyncpg
from pymongo.asynchronous.database import AsyncDatabase

from evora.http.metrics import ServiceMetrics
from evora.protocol.states import JobState
from evora.readmodels.layout import TOTAL_KEYS, Document
from evora.storage.jobs import JobStore
from evora.storage.retention import RetentionStore
from evora_services.projector.projector import Projector
from evora_services.sweeper.metrics import SweeperMetrics
from evora_services.sweeper.sweeper import Retention, Sweeper, Tuning
from tests.conftest import Clock
from tests.pipeline.conftest import Pipeline, sql_totals
from tests.projector.conftest import catch_up
from tests.projector.workload import mixed_workload
from tests.servers import api_with_read_models

QUEUES = ["alpha", "beta", "gamma"]
TOKENS = "admin:test-admin-token,producer:test-producer-token,worker:test-worker-token"
DAY = 86_400.0
# Jobs in the archived and in the live part (2,500 and 800 before). Every check compares with
# SQL and the projector on whatever history is generated, so the size is not what is tested;
# it needs every queue, "delta" (about a quarter of LIVE_JOBS) included, to have retried and
# dead-lettered jobs, which the rates check asserts. Fewer jobs: less workload, projection
# and JDBC reading, the test's cost besides Spark's fixed one.
ARCHIVED_JOBS, LIVE_JOBS = 800, 400


def sweeper_dropping_events(pool: asyncpg.Pool) -> Sweeper:
    """A sweeper that keeps finished jobs (so SQL can count them) but drops a partition of
    archived events as soon as its range has passed (run the clock past it)."""
    keep = 365 * DAY
    return Sweeper(
        JobStore(pool),
        RetentionStore(pool),
        SweeperMetrics(ServiceMetrics("sweeper")),
        Retention(
            jobs=dict.fromkeys(JobState, keep),
            idempotency_keys=keep,
            events=0.0,
            archive_events=True,
        ),
        Tuning(),
    )


def add(a: dict[str, dict[str, int]], b: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {q: dict(Counter(a.get(q, {})) + Counter(b.get(q, {}))) for q in set(a) | set(b)}


async def test_pipeline_totals_equal_projector_and_sql(
    pipeline: Pipeline,
    store: JobStore,
    pool: asyncpg.Pool,
    mongo: AsyncDatabase[Document],
    db_url: str,
    mongo_url: str,
    mongo_db_name: str,
    clock: Clock,
) -> None:
    await mixed_workload(store, pool, jobs=ARCHIVED_JOBS, queues=QUEUES, seed=1)
    projector = Projector(pool, mongo, 1, batch_size=500)
    await catch_up(projector)
    # the projector has consumed everything before anything is removed
    before = await sql_totals(pool)
    newest = await pool.fetchval("SELECT max(seq) FROM evora.job_events")

    archived = await pipeline.archive(older_than=0)
    assert archived.run_id is not None and archived.events > 0
    await clock.advance(2 * DAY)  # past the end of the partition these events are in
    removed = await sweeper_dropping_events(pool).prune_due()
    assert removed["event_partitions"] >= 1
    left = await pool.fetchval("SELECT count(*) FROM evora.job_events")
    assert left == sum(sum(t.values()) for t in before.values()) - archived.events

    # more history, which stays live; a queue the archive has never seen
    await mixed_workload(store, pool, jobs=LIVE_JOBS, queues=[*QUEUES, "delta"], seed=2)
    await catch_up(projector)
    truth = add(before, await sql_totals(pool, f"seq > {newest}"))

    # a document an earlier run wrote for a queue that no longer exists
    await mongo["analytics_queue_totals"].insert_one({"_id": "gone", "run_id": "earlier"})
    result = await pipeline.run()
    assert result.as_of["archive"]["events"] == archived.events
    assert result.as_of["events"] == sum(sum(t.values()) for t in truth.values())

    analytics = {d["_id"]: d async for d in mongo["analytics_queue_totals"].find({})}
    projected = {d["_id"]: d async for d in mongo["rm1_queues"].find({})}
    assert set(analytics) == set(projected) == set(truth) == {*QUEUES, "delta"}
    for queue, expected in truth.items():
        doc = analytics[queue]
        assert doc["by_event"] == expected, queue
        assert doc["totals"] == {k: expected.get(k, 0) for k in TOTAL_KEYS}, queue
        assert {k: v for k, v in projected[queue]["totals"].items() if v} == expected, queue
        assert doc["as_of"]["run_id"] == result.run_id

    # the other outputs agree with PostgreSQL where it can say: no job was pruned, so every
    # job's latest state is in `jobs`
    states = await pool.fetch(
        "SELECT queue, state::text, count(*) AS n FROM evora.jobs GROUP BY 1, 2"
    )
    by_state = {
        (r["queue"], r["state"]): r["jobs"]
        for r in await pipeline.output_rows("job_states")
        if r["type"] == "*"
    }
    assert by_state == {(r["queue"], r["state"]): r["n"] for r in states}
    rates = {r["queue"]: r for r in await pipeline.output_rows("rates") if r["type"] == "*"}
    for queue, expected in truth.items():
        assert rates[queue]["jobs"] == expected["submitted"]
        assert 0 < rates[queue]["retry_rate"] < 1 and 0 < rates[queue]["dlq_rate"] < 1
    minutes = await pipeline.output_rows("throughput_minute")
    completed = sum(r["completed"] for r in minutes if r["type"] == "*")
    assert completed == sum(t.get("completed", 0) for t in truth.values())

    # what operators see: the same numbers over HTTP, each queue agreeing
    async with (
        api_with_read_models(db_url, mongo_url, mongo_db_name, TOKENS) as api,
        aiohttp.ClientSession(headers={"Authorization": "Bearer test-admin-token"}) as http,
    ):
        async with http.get(f"{api}/v1/analytics") as response:
            assert response.status == 200, await response.text()
            served = await response.json()
        async with http.get(f"{api}/v1/analytics/queues/alpha") as response:
            assert response.status == 200, await response.text()
            alpha = await response.json()
    assert served["ran"] is True and served["next"] is None
    assert served["as_of"]["run_id"] == result.run_id
    assert served["as_of"]["events"] == result.as_of["events"]
    assert served["as_of"]["archive"]["events"] == archived.events
    assert [q["queue"] for q in served["queues"]] == sorted(truth)
    for queue in served["queues"]:
        expected = truth[queue["queue"]]
        assert queue["agree"] is True, queue
        assert queue["pipeline"]["by_event"] == expected, queue
        assert queue["pipeline"]["totals"] == queue["projector"]["totals"], queue
        assert queue["rates"]["jobs"] > 0 and queue["latency"]["wait"]["samples"] > 0, queue
    # and per job type: the all-types row first, then each type, adding up to it
    everything, *types = alpha["types"]
    assert everything["type"] == "*" and types and alpha["next"] is None
    assert everything["events"] == truth["alpha"]
    for name in everything["events"]:
        assert sum(t["events"].get(name, 0) for t in types) == everything["events"][name]
    assert sum(everything["jobs"].values()) == everything["rates"]["jobs"]
    assert sum(t["rates"]["jobs"] for t in types) == everything["rates"]["jobs"]
    assert everything["latency"]["run"]["samples"] > 0
    assert everything["failure_reasons"]  # the workload fails jobs
    assert [r["rank"] for r in everything["failure_reasons"]] == list(
        range(1, len(everything["failure_reasons"]) + 1)
    )
