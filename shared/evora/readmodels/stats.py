"""The queue-stats document and how the api renders it (docs/http-api.md#queue-stats).

The projector stores raw material (counts, totals, 10-second completion buckets, recent
latency percentiles, a per-minute history of the last day); rates are computed at read time
so they decay while a queue is idle.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
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


# -- the per-minute history (docs/http-api.md#queue-history) --------------------------------
#
# A queue document's `history` is {hour: {minute of the hour: [n per MINUTE_FIELDS]}}, keys
# as decimal strings, hours and minutes counted from the epoch (UTC). Nesting by hour lets a
# reader fetch only the hours its window spans and the projector drop a whole hour with one
# `$unset`; only minutes with an event hold an entry. The document keeps HISTORY_HOURS whole
# hours before the newest one, so its size is bounded (at most
# (HISTORY_HOURS + 1) * 60 minutes) however long the queue lives.

MINUTE_SECONDS = 60
HISTORY_HOURS = 24
HISTORY_MINUTES = HISTORY_HOURS * 60
MINUTE_FIELDS = (
    "submitted",
    "completed",
    "failed",
    "dead_lettered",
    "wait_ms_sum",
    "wait_n",
    "run_ms_sum",
    "run_n",
)
COUNTED_EVENTS = MINUTE_FIELDS[:4]
SLOT = {name: index for index, name in enumerate(MINUTE_FIELDS)}


def minute_of(at: datetime) -> int:
    return int(at.timestamp()) // MINUTE_SECONDS


def hour_of(minute: int) -> int:
    return minute // 60


def oldest_kept_hour(newest_minute: int) -> int:
    return hour_of(newest_minute) - HISTORY_HOURS


def history_fields(first_minute: int, last_minute: int) -> dict[str, int]:
    """The projection that reads the history of these minutes, and nothing else."""
    return {f"history.{hour}": 1 for hour in range(hour_of(first_minute), hour_of(last_minute) + 1)}


def _mean(total: float, n: float) -> float | None:
    return round(total / n, 3) if n else None


def render_history(doc: Document, first_minute: int, minutes: int) -> dict[str, Any]:
    """One column per series, one value per minute from `first_minute` on, oldest first:
    counts of events (0 for a quiet minute) and mean latencies (null with no sample)."""
    history = doc.get("history", {})
    empty = [0] * len(MINUTE_FIELDS)
    rows: list[Sequence[float]] = []
    for minute in range(first_minute, first_minute + minutes):
        rows.append(history.get(str(hour_of(minute)), {}).get(str(minute % 60), empty))
    start = datetime.fromtimestamp(first_minute * MINUTE_SECONDS, UTC)
    rendered: dict[str, Any] = {
        "queue": doc["_id"],
        "step_seconds": MINUTE_SECONDS,
        "start": start,
        "end": start + timedelta(minutes=minutes),
    }
    for name in COUNTED_EVENTS:
        rendered[name] = [int(row[SLOT[name]]) for row in rows]
    for kind in ("wait", "run"):
        total, n = SLOT[f"{kind}_ms_sum"], SLOT[f"{kind}_n"]
        rendered[f"{kind}_ms"] = [_mean(row[total], row[n]) for row in rows]
    return rendered


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
