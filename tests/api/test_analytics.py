"""GET /v1/analytics over HTTP: the pipeline's documents (inserted here in the shape `evora
pipeline run` writes; tests/pipeline/test_history.py has a real run's) beside a real
projector's read models."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import asyncpg
import pytest
from pymongo.asynchronous.database import AsyncDatabase

from evora.protocol.jobs import JobSubmission
from evora.readmodels.layout import TOTAL_KEYS, Document
from evora.sdk.client import Client
from evora.storage.jobs import JobStore
from evora_services.api.stats import encode_key
from evora_services.projector.projector import Projector
from tests.servers import api_with_read_models

ADMIN = {"Authorization": "Bearer test-admin-token"}
TOKENS = "admin:test-admin-token,producer:test-producer-token,worker:test-worker-token"
RAN_AT = datetime(2026, 11, 29, 4, 0, tzinfo=UTC)


@pytest.fixture
async def api_url(db_url: str, mongo_url: str, mongo_db_name: str) -> AsyncIterator[str]:
    async with api_with_read_models(db_url, mongo_url, mongo_db_name, TOKENS) as url:
        yield url


def as_of(run_id: str, at: datetime = RAN_AT) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "at": at,
        "events": 9,
        "seq": 9,
        "below_xid": 1000,
        "archive": {"upto_seq": 0, "below_xid": 0, "events": 0},
    }


def queue_totals(queue: str, run_id: str, **totals: int) -> Document:
    """An `analytics_queue_totals` document as `evora pipeline run` writes it."""
    return {
        "_id": queue,
        "queue": queue,
        "totals": {key: totals.get(key, 0) for key in TOTAL_KEYS},
        "by_event": {k: v for k, v in totals.items() if v},
        "events": sum(totals.values()),
        "run_id": run_id,
        "as_of": as_of(run_id),
    }


async def project(pool: asyncpg.Pool, mongo: AsyncDatabase[Document]) -> None:
    projector = Projector(pool, mongo, 1)
    while await projector.run_once():
        pass


async def get(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url) as r:
        assert r.status == 200, await r.text()
        body: dict[str, Any] = await r.json()
        return body


async def test_before_the_pipeline_ran_the_live_totals_are_listed_alone(
    api_url: str, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    async with aiohttp.ClientSession(headers=ADMIN) as http:
        empty = await get(http, api_url + "/v1/analytics")
        assert empty == {
            "ran": False,
            "as_of": None,
            "projector_as_of": {"seq": 0, "at": None},
            "queues": [],
            "next": None,
        }
        await JobStore(pool).submit_batch([JobSubmission(queue="mail", type="send")] * 2)
        await project(pool, mongo)
        body = await get(http, api_url + "/v1/analytics")
    assert body["ran"] is False and body["as_of"] is None
    newest = await pool.fetchval("SELECT max(seq) FROM evora.job_events")
    assert body["projector_as_of"]["seq"] == newest
    [mail] = body["queues"]
    assert mail["queue"] == "mail"
    assert mail["pipeline"] is None and mail["agree"] is False
    assert mail["projector"]["totals"] == {k: 2 if k == "submitted" else 0 for k in TOTAL_KEYS}
    assert mail["rates"] is None and mail["latency"] == {"wait": None, "run": None}


async def test_each_queue_from_either_side_with_whether_the_totals_agree(
    api_url: str, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    store = JobStore(pool)
    await store.submit_batch(
        [JobSubmission(queue=q, type="t") for q in ("agrees", "differs", "newer")]
    )
    [job] = await store.claim(worker_id="w", queues=["agrees"], max_jobs=1)
    await store.complete(job["id"], job["lease_token"])
    await project(pool, mongo)
    analytics = mongo["analytics_queue_totals"]
    await analytics.insert_many(
        [
            queue_totals("agrees", "r2", submitted=1, claimed=1, completed=1),
            queue_totals("differs", "r2", submitted=2),
            # archived, removed from PostgreSQL, then the read models rebuilt: only here
            queue_totals("archived", "r2", submitted=5, completed=5),
        ]
    )
    # an earlier run's document still there while the newest run writes
    older = queue_totals("zz-older", "r1")
    older["as_of"] = as_of("r1", datetime(2026, 11, 28, tzinfo=UTC))
    await analytics.insert_one(older)
    await mongo["analytics_rates"].insert_one(
        {
            "_id": "agrees/*",
            "queue": "agrees",
            "type": "*",
            "jobs": 1,
            "retried_jobs": 0,
            "retries": 0,
            "dead_lettered_jobs": 0,
            "retry_rate": 0.0,
            "dlq_rate": 0.0,
        }
    )
    latency = {"samples": 1, "p50_ms": 3.0, "p90_ms": 3.0, "p95_ms": 3.0, "p99_ms": 3.0}
    await mongo["analytics_latency"].insert_many(
        [
            # per type rows are not part of the queue's summary
            {"_id": "agrees/t/wait", **latency, "mean_ms": 3.0, "max_ms": 3.0},
            {"_id": "agrees/*/wait", **latency, "mean_ms": 3.0, "max_ms": 3.0},
        ]
    )
    async with aiohttp.ClientSession(headers=ADMIN) as http:
        body = await get(http, api_url + "/v1/analytics")
        async with http.get(
            api_url + "/v1/analytics", headers={"Authorization": "Bearer test-producer-token"}
        ) as r:
            assert r.status == 403
    assert body["ran"] is True
    assert body["as_of"] == {**as_of("r2"), "at": "2026-11-29T04:00:00Z"}
    queues = {q["queue"]: q for q in body["queues"]}
    assert list(queues) == ["agrees", "archived", "differs", "newer", "zz-older"]
    agrees = queues["agrees"]
    assert agrees["agree"] is True
    assert agrees["pipeline"] == {
        "totals": {k: 1 if k in ("submitted", "completed") else 0 for k in TOTAL_KEYS},
        "by_event": {"submitted": 1, "claimed": 1, "completed": 1},
        "events": 3,
        "run_id": "r2",
    }
    assert agrees["projector"] == {"totals": agrees["pipeline"]["totals"]}
    assert agrees["rates"]["jobs"] == 1 and agrees["rates"]["retry_rate"] == 0.0
    assert agrees["latency"]["wait"] == {**latency, "mean_ms": 3.0, "max_ms": 3.0}
    assert agrees["latency"]["run"] is None
    assert queues["differs"]["agree"] is False
    assert queues["differs"]["pipeline"]["totals"]["submitted"] == 2
    assert queues["differs"]["projector"]["totals"]["submitted"] == 1
    assert queues["archived"]["projector"] is None and queues["archived"]["agree"] is False
    assert queues["newer"]["pipeline"] is None and queues["newer"]["agree"] is False
    assert queues["zz-older"]["pipeline"]["run_id"] == "r1"


async def test_queues_come_a_page_at_a_time_and_bad_parameters_are_refused(
    api_url: str, pool: asyncpg.Pool, mongo: AsyncDatabase[Document]
) -> None:
    # interleaved: even names only in the pipeline's results, odd ones only in the projector's
    names = [f"q{i:02d}" for i in range(11)]
    await JobStore(pool).submit_batch([JobSubmission(queue=q, type="t") for q in names[1::2]])
    await project(pool, mongo)
    await mongo["analytics_queue_totals"].insert_many(
        [queue_totals(q, "r", submitted=1) for q in names[0::2]]
    )
    listed: list[list[str]] = []
    url = api_url + "/v1/analytics?limit=4"
    async with aiohttp.ClientSession(headers=ADMIN) as http:
        while True:
            body = await get(http, url)
            listed.append([q["queue"] for q in body["queues"]])
            assert body["ran"] is True
            if body["next"] is None:
                break
            url = f"{api_url}/v1/analytics?limit=4&after={body['next']}"
        for query in (
            "limit=0",
            "limit=501",
            "limit=all",
            "after=nope",
            f"after={encode_key(['a', 'b'])}",
            "queue=q01",
        ):
            async with http.get(f"{api_url}/v1/analytics?{query}") as r:
                assert r.status == 422, (query, r.status)
                assert r.content_type == "application/problem+json"
                assert (await r.json())["code"] == "validation_error"
    assert listed == [names[0:4], names[4:8], names[8:]]

    async with Client(api_url, "test-admin-token") as client:
        everything = await client.analytics()
    assert everything["ran"] is True and everything["next"] is None
    assert [q["queue"] for q in everything["queues"]] == names
    assert [q["pipeline"] is not None for q in everything["queues"]] == [
        i % 2 == 0 for i in range(11)
    ]


def type_docs(queue: str, job_type: str, jobs: int) -> dict[str, list[Document]]:
    """One job type's documents in each per-type `analytics_*` collection."""
    key = f"{queue}/{job_type}"
    row = {"queue": queue, "type": job_type}
    reason = {"error_type": "ValueError", "message": "bad", "last_at": RAN_AT}
    summary = {"p50_ms": 1.0, "p90_ms": 2.0, "p95_ms": 2.0, "p99_ms": 2.0}
    return {
        "analytics_rates": [
            {"_id": key, **row, "jobs": jobs, "retried_jobs": 1, "retries": 1}
            | {"dead_lettered_jobs": 0, "retry_rate": 1 / jobs, "dlq_rate": 0.0}
        ],
        "analytics_event_totals": [
            {"_id": f"{key}/submitted", **row, "event": "submitted", "events": jobs},
            {"_id": f"{key}/failed", **row, "event": "failed", "events": 1},
        ],
        "analytics_job_states": [
            {"_id": f"{key}/PENDING", **row, "state": "PENDING", "jobs": jobs}
        ],
        "analytics_latency": [
            {"_id": f"{key}/wait", **row, "kind": "wait", "samples": jobs, **summary}
            | {"mean_ms": 1.5, "max_ms": 2.0}
        ],
        "analytics_failure_reasons": [
            {"_id": f"{key}/2", **row, "rank": 2, **reason, "message": "worse", "failures": 1},
            {"_id": f"{key}/1", **row, "rank": 1, **reason, "failures": 3},
        ],
    }


async def test_a_queues_job_types_come_a_page_at_a_time(
    api_url: str, mongo: AsyncDatabase[Document]
) -> None:
    async with aiohttp.ClientSession(headers=ADMIN) as http:
        never = await get(http, api_url + "/v1/analytics/queues/mail")
        assert never == {"queue": "mail", "ran": False, "as_of": None, "types": [], "next": None}

        await mongo["analytics_queue_totals"].insert_one(queue_totals("mail", "r2", submitted=6))
        # queues whose names start like "mail": none of their types belongs to it
        for queue, job_type, jobs in [
            ("mail", "*", 6),
            ("mail", "a.x", 2),
            ("mail", "b.y", 4),
            ("mail", "b.y.z", 7),  # a type whose name starts like another's
            ("mail.x", "a.x", 1),
            ("mail-x", "a.x", 1),
            ("mailbox", "a.x", 1),
        ]:
            for collection, docs in type_docs(queue, job_type, jobs).items():
                await mongo[collection].insert_many(docs)

        first = await get(http, api_url + "/v1/analytics/queues/mail?limit=2")
        assert first["ran"] is True and first["as_of"]["run_id"] == "r2"
        assert [t["type"] for t in first["types"]] == ["*", "a.x"]
        second = await get(
            http, f"{api_url}/v1/analytics/queues/mail?limit=2&after={first['next']}"
        )
        assert [t["type"] for t in second["types"]] == ["b.y", "b.y.z"]
        assert second["next"] is None

        b, _ = second["types"]
        assert b["events"] == {"submitted": 4, "failed": 1}
        assert b["jobs"] == {"PENDING": 4}
        assert b["rates"]["jobs"] == 4 and b["rates"]["retry_rate"] == 0.25
        assert b["latency"]["wait"]["samples"] == 4 and b["latency"]["run"] is None
        assert [(r["rank"], r["message"], r["failures"]) for r in b["failure_reasons"]] == [
            (1, "bad", 3),
            (2, "worse", 1),
        ]
        assert b["failure_reasons"][0]["last_at"] == "2026-11-29T04:00:00Z"

        for query in ("limit=0", "after=nope", f"after={encode_key(['no/slash'])}", "type=a"):
            async with http.get(f"{api_url}/v1/analytics/queues/mail?{query}") as r:
                assert r.status == 422, (query, r.status)
                assert (await r.json())["code"] == "validation_error"
        async with http.get(f"{api_url}/v1/analytics/queues/not%20a%20queue") as r:
            assert r.status == 422
