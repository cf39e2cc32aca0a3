"""Every metric the Grafana dashboards and the alert rules query is exported by the real
services: api, dispatcher, sweeper and projector run in this process on the test PostgreSQL
and MongoDB, are exercised until their labelled series exist, and are scraped."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from evora.config import Settings
from evora_services.api.app import create_app as create_api
from evora_services.dispatcher import limits as limit_metrics
from evora_services.dispatcher.app import create_app as create_dispatcher
from evora_services.projector.app import create_app as create_projector
from evora_services.sweeper.app import create_app as create_sweeper
from tests.deploy import artifacts
from tests.deploy.promql import label_values_query, parse
from tests.servers import Service, serve

TOKENS = "admin:test-admin-token,producer:test-producer-token,worker:test-worker-token"
PRODUCER = {"Authorization": "Bearer test-producer-token"}
ADMIN = {"Authorization": "Bearer test-admin-token"}
WORKER = {"Authorization": "Bearer test-worker-token"}
QUEUE = "deploy-check"
LIMITED_QUEUE = "deploy-limited"

# Series Prometheus itself adds: `up` per target, `job`/`instance` on every series.
PROMETHEUS_METRICS = {"up": {"job", "instance"}}
TARGET_LABELS = {"job", "instance", "pod", "namespace"}

Catalogue = dict[str, set[str]]  # sample name -> label names seen on it


async def _scrape(http: aiohttp.ClientSession, url: str) -> tuple[Catalogue, dict[str, float]]:
    async with http.get(url + "/metrics") as response:
        assert response.status == 200
        text = await response.text()
    catalogue: Catalogue = defaultdict(set)
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            catalogue[sample.name].update(sample.labels)
            key = sample.name + str(sorted(sample.labels.items()))
            values[key] = sample.value
    return catalogue, values


async def _exercise(http: aiohttp.ClientSession, api: str, dispatcher: str) -> None:
    """Submit, claim, complete, fail into the DLQ and miss, so the labelled series of every
    service exist."""
    for n in range(3):
        async with http.post(
            f"{api}/v1/jobs", json={"queue": QUEUE, "type": f"t{n}"}, headers=PRODUCER
        ) as response:
            assert response.status == 201, await response.text()
    async with http.post(f"{api}/v1/jobs", json={"queue": QUEUE}, headers=PRODUCER) as response:
        assert response.status == 422
    claim = {"worker_id": "deploy-w", "queues": [QUEUE], "max_jobs": 3, "wait_seconds": 0}
    async with http.post(f"{dispatcher}/v1/claim", json=claim, headers=WORKER) as response:
        jobs: list[dict[str, Any]] = (await response.json())["jobs"]
    assert len(jobs) == 3
    first, second, _third = jobs
    async with http.post(
        f"{dispatcher}/v1/jobs/{first['id']}/complete",
        json={"lease_token": first["lease_token"], "result": {"ok": True}},
        headers=WORKER,
    ) as response:
        assert response.status == 200, await response.text()
    async with http.post(
        f"{dispatcher}/v1/jobs/{second['id']}/fail",
        json={
            "lease_token": second["lease_token"],
            "error": {"message": "no", "type": "Check", "retryable": False},
        },
        headers=WORKER,
    ) as response:
        assert response.status == 200, await response.text()
        assert (await response.json())["state"] == "DLQ"


async def _throttle(http: aiohttp.ClientSession, api: str, dispatcher: str) -> None:
    """A rate and concurrency limit with one job running under it and one held back, so the
    flow-control gauges have series."""
    limit = {"concurrency": 1, "rate": {"limit": 5, "per_seconds": 60}}
    async with http.put(f"{api}/v1/limits/deploy:*", json=limit, headers=ADMIN) as response:
        assert response.status == 201, await response.text()
    job = {"queue": LIMITED_QUEUE, "type": "t", "limit_keys": ["deploy:1"]}
    batch = {"jobs": [job, job]}
    async with http.post(f"{api}/v1/jobs/batch", json=batch, headers=PRODUCER) as response:
        assert response.status == 200, await response.text()
    claim = {"worker_id": "deploy-w", "queues": [LIMITED_QUEUE], "max_jobs": 2, "wait_seconds": 0}
    async with http.post(f"{dispatcher}/v1/claim", json=claim, headers=WORKER) as response:
        assert len((await response.json())["jobs"]) == 1


async def _wait_in_vain(http: aiohttp.ClientSession, dispatcher: str) -> None:
    """A long-poll that waits, finding nothing: the waiting gauge has a series for its queue
    only while it waits."""
    wait = {"worker_id": "deploy-w", "queues": ["deploy-empty"], "wait_seconds": 60}
    async with http.post(f"{dispatcher}/v1/claim", json=wait, headers=WORKER) as response:
        assert (await response.json())["jobs"] == []


@pytest.fixture
async def catalogue(
    db_url: str, mongo_url: str, mongo_db_name: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Catalogue]:
    # the flow-control gauges are read every 15 s; here at once after _throttle
    monkeypatch.setattr(limit_metrics, "CHECK_SECONDS", 0.1)
    settings = Settings(
        database_url=db_url, mongo_url=mongo_url, mongo_db=mongo_db_name, tokens=TOKENS
    )
    running: list[Service] = []
    try:
        for name, factory in (
            ("api", create_api),
            ("dispatcher", create_dispatcher),
            ("sweeper", create_sweeper),
            ("projector", create_projector),
        ):
            app = await factory(settings)
            running.append(await serve(app, name, handler_cancellation=name == "dispatcher"))
        urls = {r.name: r.url for r in running}
        async with aiohttp.ClientSession() as http:
            await _exercise(http, urls["api"], urls["dispatcher"])
            await _throttle(http, urls["api"], urls["dispatcher"])
            # The projector exports per-queue figures once it has applied the events and
            # refreshed its snapshot (every couple of seconds).
            deadline = time.monotonic() + 30
            while True:
                found, values = await _scrape(http, urls["projector"])
                dlq = f"evora_queue_jobs[('queue', '{QUEUE}'), ('state', 'DLQ')]"
                if values.get(dlq) == 1.0 and "evora_queue_events_total" in found:
                    break
                assert time.monotonic() < deadline, "the projector never exported the queue"
                await asyncio.sleep(0.2)
            waiting = asyncio.create_task(_wait_in_vain(http, urls["dispatcher"]))
            while {"evora_dispatcher_waiting_polls", "evora_limit_tokens"} - found.keys():
                assert time.monotonic() < deadline, "the long-poll never waited"
                await asyncio.sleep(0.05)
                found, _ = await _scrape(http, urls["dispatcher"])
            merged: Catalogue = defaultdict(set)
            for url in urls.values():
                found, _ = await _scrape(http, url)
                for name, labels in found.items():
                    merged[name] |= labels
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
        yield merged
    finally:
        for service in reversed(running):
            await service.close()


def _check(where: str, expr: str, catalogue: Catalogue) -> list[str]:
    problems = []
    known = {**catalogue, **PROMETHEUS_METRICS}
    parsed = parse(expr)
    available: set[str] = set(TARGET_LABELS)
    for selector in parsed.selectors:
        if selector.metric not in known:
            problems.append(f"{where}: {selector.metric} is not exported ({expr})")
            continue
        labels = known[selector.metric] | TARGET_LABELS
        available |= labels
        for label in selector.matchers:
            if label not in labels:
                problems.append(f"{where}: {selector.metric} has no label {label!r}")
    for label in parsed.grouping_labels - available:
        problems.append(f"{where}: groups by {label!r}, which no selected metric has")
    return problems


async def test_dashboards_alerts_and_autoscalers_use_only_exported_metrics(
    catalogue: Catalogue,
) -> None:
    queries = [
        *artifacts.dashboard_queries(),
        *artifacts.alert_queries(),
        *artifacts.autoscaling_queries(),
    ]
    assert len(queries) > 40
    problems = [p for where, expr in queries for p in _check(where, expr, catalogue)]
    for where, query in artifacts.dashboard_variable_queries():
        wanted = label_values_query(query)
        assert wanted is not None, f"{where}: unexpected variable query {query!r}"
        metric, label = wanted
        if label not in catalogue.get(metric, set()):
            problems.append(f"{where}: {metric} with label {label} is not exported")
    assert not problems, "\n".join(problems)


async def test_catalogue_is_documented_and_consistent(catalogue: Catalogue) -> None:
    """docs/metrics.md lists every evora_* metric family the services export, and every
    family follows the naming rules (evora_ prefix; no id-like labels)."""
    doc = (artifacts.ROOT / "docs" / "metrics.md").read_text()
    families = {_family(name) for name in catalogue if name.startswith("evora_")}
    missing = sorted(f for f in families if f"`{f}`" not in doc)
    assert not missing, f"docs/metrics.md does not list: {missing}"
    forbidden = {"job_id", "id", "worker_id", "lease_token", "request_id", "idempotency_key"}
    for name, labels in catalogue.items():
        assert not labels & forbidden, f"{name} has an unbounded label: {labels & forbidden}"


def _family(sample: str) -> str:
    for suffix in ("_bucket", "_count", "_sum", "_created", "_total"):
        if sample.endswith(suffix):
            return sample.removesuffix(suffix)
    return sample
