"""The analytics on a small hand-written history whose answers can be worked out by hand."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from evora_services.pipeline import analytics
from evora_services.pipeline.events import EVENT_SCHEMA

T0 = datetime(2026, 1, 5, 10, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class History:
    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def event(
        self,
        job: str,
        job_type: str,
        event: str,
        to_state: str,
        seconds: float,
        *,
        data: dict[str, Any] | None = None,
        started: float | None = None,
        queue: str = "q",
    ) -> None:
        seq = len(self.rows) + 1
        image = {"started_at": at(started).isoformat()} if started is not None else {}
        self.rows.append(
            (
                seq, seq, job, seq, queue, job_type, event, None, to_state, 0, None,
                at(seconds), json.dumps(data or {}), json.dumps(image),
            )
        )  # fmt: skip

    def frame(self, spark: SparkSession) -> DataFrame:
        return spark.createDataFrame(self.rows, EVENT_SCHEMA)


@pytest.fixture(scope="module")
def outputs(spark: SparkSession) -> dict[str, list[dict[str, Any]]]:
    h = History()
    # a: submitted, claimed after 1 s, completed 2 s later
    h.event("a", "x", "submitted", "PENDING", 0)
    h.event("a", "x", "claimed", "RUNNING", 1, started=1)
    h.event("a", "x", "completed", "COMPLETED", 3, started=1)
    # b: claimed after 3 s, fails (retried), claimed again, fails for good: dead-lettered
    h.event("b", "x", "submitted", "PENDING", 0)
    h.event("b", "x", "claimed", "RUNNING", 3, started=3)
    timeout = {"error": {"type": "Timeout", "message": "slow"}}
    h.event("b", "x", "failed", "PENDING", 4, data=timeout, started=3)
    h.event("b", "x", "claimed", "RUNNING", 70, started=70)
    bad = {"error": {"type": "ValueError", "message": "bad"}, "reason": "not_retryable"}
    h.event("b", "x", "dead_lettered", "DLQ", 71, data=bad, started=70)
    # c (another type): claimed after 5 s, lease expires, claimed and completed in 4 s
    h.event("c", "y", "submitted", "PENDING", 0)
    h.event("c", "y", "claimed", "RUNNING", 5, started=5)
    h.event("c", "y", "lease_expired", "PENDING", 65, started=5)
    h.event("c", "y", "claimed", "RUNNING", 66, started=66)
    h.event("c", "y", "completed", "COMPLETED", 70, started=66)
    # d: never claimed, cancelled
    h.event("d", "y", "submitted", "PENDING", 10)
    h.event("d", "y", "cancelled", "CANCELLED", 20)
    history = h.frame(spark)
    jobs = analytics.per_job(history)
    totals = analytics.event_totals(history)
    minute = analytics.throughput(history, "minute")
    frames = {
        "event_totals": totals,
        "queue_totals": analytics.queue_totals(totals),
        "job_states": analytics.job_states(jobs),
        "rates": analytics.rates(jobs),
        "latency": analytics.latency(jobs),
        "throughput_minute": minute,
        "throughput_hour": analytics.hourly(minute),
        "failure_reasons": analytics.failure_reasons(history, top=1),
    }
    return {name: [r.asDict(recursive=True) for r in df.collect()] for name, df in frames.items()}


def by(rows: list[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    keyed = {tuple(r[k] for k in keys): r for r in rows}
    assert len(keyed) == len(rows), "keys are unique"
    return keyed


def test_totals_and_states(outputs: dict[str, list[dict[str, Any]]]) -> None:
    totals = by(outputs["event_totals"], "type", "event")
    assert totals[("x", "claimed")]["events"] == 3
    assert totals[("*", "claimed")]["events"] == 5
    [queue] = outputs["queue_totals"]
    assert queue["totals"] == {
        "submitted": 4,
        "completed": 2,
        "failed": 1,
        "dead_lettered": 1,
        "retried": 0,
        "lease_expired": 1,
    }
    assert queue["by_event"]["cancelled"] == 1 and queue["events"] == 15
    states = {k: r["jobs"] for k, r in by(outputs["job_states"], "type", "state").items()}
    assert states == {
        ("x", "COMPLETED"): 1,
        ("x", "DLQ"): 1,
        ("y", "COMPLETED"): 1,
        ("y", "CANCELLED"): 1,
        ("*", "COMPLETED"): 2,
        ("*", "DLQ"): 1,
        ("*", "CANCELLED"): 1,
    }


def test_rates(outputs: dict[str, list[dict[str, Any]]]) -> None:
    rates = by(outputs["rates"], "type")
    assert (rates[("x",)]["retry_rate"], rates[("x",)]["dlq_rate"]) == (0.5, 0.5)
    assert (rates[("y",)]["retry_rate"], rates[("y",)]["dlq_rate"]) == (0.5, 0.0)
    assert rates[("*",)]["jobs"] == 4 and rates[("*",)]["retries"] == 2
    assert (rates[("*",)]["retry_rate"], rates[("*",)]["dlq_rate"]) == (0.5, 0.25)


def test_latency(outputs: dict[str, list[dict[str, Any]]]) -> None:
    latency = by(outputs["latency"], "type", "kind")
    # waits: a 1 s, b 3 s (type x); c 5 s (type y); d never claimed
    assert latency[("x", "wait")]["samples"] == 2
    assert (latency[("x", "wait")]["p50_ms"], latency[("x", "wait")]["p99_ms"]) == (1000, 3000)
    assert latency[("*", "wait")]["samples"] == 3
    assert latency[("*", "wait")]["p50_ms"] == 3000 and latency[("*", "wait")]["max_ms"] == 5000
    # runs: a 2 s, c 4 s (its second attempt)
    assert latency[("*", "run")]["samples"] == 2
    assert (latency[("*", "run")]["p50_ms"], latency[("*", "run")]["p99_ms"]) == (2000, 4000)
    assert latency[("*", "run")]["mean_ms"] == 3000


def test_throughput(outputs: dict[str, list[dict[str, Any]]]) -> None:
    minutes = by(outputs["throughput_minute"], "type", "minute")
    # PySpark hands timestamps back as naive datetimes in the local time zone
    first, second = (datetime.fromtimestamp(at(s).timestamp()) for s in (0, 60))
    assert minutes[("*", first)]["submitted"] == 4
    assert minutes[("*", first)]["completed"] == 1
    assert minutes[("*", second)]["completed"] == 1
    assert minutes[("*", second)]["dead_lettered"] == 1
    hours = by(outputs["throughput_hour"], "type", "hour")
    assert hours[("*", first)]["claimed"] == 5 and hours[("x", first)]["claimed"] == 3


def test_failure_reasons(outputs: dict[str, list[dict[str, Any]]]) -> None:
    reasons = by(outputs["failure_reasons"], "type", "rank")
    assert set(reasons) == {("x", 1), ("*", 1)}  # top=1; y had no failures with an error
    top = reasons[("*", 1)]
    # one failure each: ties are broken by message
    assert (top["error_type"], top["message"], top["failures"]) == ("ValueError", "bad", 1)
