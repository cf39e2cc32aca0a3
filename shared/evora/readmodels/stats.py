"""The queue-stats document and how the api renders it (docs/http-api.md#queue-stats).

The projector stores raw material (counts, totals, 10-second completion buckets, recent
latency percentiles); rates are computed at read time so they decay while a queue is idle.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from evora.readmodels.layout import STATE_NAMES, TOTAL_KEYS, Document

BUCKET_SECONDS = 10
WINDOWS_MINUTES = (1, 5, 15)
# Buckets older than the widest window are dropped by the projector.
KEEP_BUCKETS_SECONDS = max(WINDOWS_MINUTES) * 60 + BUCKET_SECONDS
# What rendering reads of a queue document: not the latency samples, most of its size.
STATS_FIELDS = dict.fromkeys(
    ("counts", "totals", "completed_buckets", "latency_ms", "oldest_pending_at"), 1
)


# Latency with no sample yet: unknown, which is not 0 ms.
NO_PERCENTILES: dict[str, float | None] = {"p50": None, "p95": None, "p99": None}


def bucket_of(at: datetime) -> int:
    return int(at.timestamp()) // BUCKET_SECONDS


def completed_per_minute(buckets: dict[str, int], now: datetime) -> dict[str, float]:
    current = bucket_of(now)
    rates = {}
    for minutes in WINDOWS_MINUTES:
        first = current - minutes * 60 // BUCKET_SECONDS + 1
        total = sum(n for key, n in buckets.items() if first <= int(key) <= current)
        rates[f"{minutes}m"] = round(total / minutes, 3)
    return rates


def as_utc(value: Any) -> Any:
    # MongoDB hands back naive datetimes unless the client is tz-aware; they are UTC.
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def render_queue_stats(
    doc: Document, *, paused: bool, as_of: dict[str, Any], now: datetime
) -> dict[str, Any]:
    counts = doc.get("counts", {})
    totals = doc.get("totals", {})
    latency = doc.get("latency_ms", {})
    return {
        "queue": doc["_id"],
        "paused": paused,
        "counts": {state: int(counts.get(state, 0)) for state in STATE_NAMES},
        "totals": {key: int(totals.get(key, 0)) for key in TOTAL_KEYS},
        "throughput": {
            "completed_per_minute": completed_per_minute(doc.get("completed_buckets", {}), now)
        },
        "latency_ms": {
            "wait": latency.get("wait", NO_PERCENTILES),
            "run": latency.get("run", NO_PERCENTILES),
        },
        "oldest_pending_at": as_utc(doc.get("oldest_pending_at")),
        "as_of": {"seq": int(as_of.get("seq", 0)), "at": as_utc(as_of.get("at"))},
    }
