"""The pipeline's analytics as the api serves them (docs/http-api.md#get-v1analytics).

`evora pipeline run` writes MongoDB collections `analytics_<output>`, one document per row
of its output, each stamped with the run's `run_id` and `as_of`. The api reads them beside
the projector's read models: per queue, the pipeline's totals next to the projector's, and
whether they agree (on the same events they must: the pipeline recounts the whole history,
archive included, which the projector counted as it went).
"""

from __future__ import annotations

from typing import Any

from pymongo.asynchronous.database import AsyncDatabase

from evora.readmodels.layout import TOTAL_KEYS, Document, Generation
from evora.readmodels.stats import as_utc

# `analytics_<output>` for each output of `evora pipeline run`.
COLLECTION_PREFIX = "analytics_"
QUEUE_TOTALS = COLLECTION_PREFIX + "queue_totals"
RATES = COLLECTION_PREFIX + "rates"
LATENCY = COLLECTION_PREFIX + "latency"
# The pipeline's rows for all of a queue's types together (job types cannot contain "*").
ALL_TYPES = "*"
LATENCY_KINDS = ("wait", "run")
RATE_FIELDS = ("jobs", "retried_jobs", "retries", "dead_lettered_jobs", "retry_rate", "dlq_rate")
LATENCY_FIELDS = ("samples", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms", "max_ms")


def _as_of(doc: Document) -> dict[str, Any]:
    as_of: dict[str, Any] = dict(doc.get("as_of") or {})
    as_of["at"] = as_utc(as_of.get("at"))
    return as_of


def _totals(doc: Document | None) -> dict[str, int] | None:
    if doc is None:
        return None
    totals = doc.get("totals") or {}
    return {key: int(totals.get(key, 0)) for key in TOTAL_KEYS}


def _pick(doc: Document | None, fields: tuple[str, ...]) -> dict[str, Any] | None:
    return None if doc is None else {f: doc.get(f) for f in fields}


async def _page_of_names(
    db: AsyncDatabase[Document], generation: Generation, limit: int, after: str | None
) -> tuple[list[str], bool]:
    """Up to `limit` queue names after `after`, from either side, and whether more follow."""
    found = {} if after is None else {"_id": {"$gt": after}}
    names: set[str] = set()
    for collection in (db[QUEUE_TOTALS], generation.queues):
        cursor = collection.find(found, {"_id": 1}).sort("_id", 1).limit(limit + 1)
        names.update([doc["_id"] async for doc in cursor])
    ordered = sorted(names)
    return ordered[:limit], len(ordered) > limit


async def analytics_page(
    db: AsyncDatabase[Document],
    generation: Generation,
    projector_as_of: dict[str, Any],
    *,
    limit: int,
    after: str | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]], str | None]:
    """The latest run's `as_of` (and whether there was one) beside the projector's, a page
    of queues by name (every queue either side has seen, each with the pipeline's totals,
    rates and latency for all its types, the projector's totals, and whether they agree),
    and the last queue's name when more follow."""
    # While a run writes, documents of two runs coexist: the newest run is the one shown.
    newest = await db[QUEUE_TOTALS].find_one({}, {"as_of": 1}, sort=[("as_of.at", -1)])
    header = {
        "ran": newest is not None,
        "as_of": None if newest is None else _as_of(newest),
        "projector_as_of": projector_as_of,
    }
    names, more = await _page_of_names(db, generation, limit, after)
    ids = [f"{queue}/{ALL_TYPES}" for queue in names]
    pipeline = {d["_id"]: d async for d in db[QUEUE_TOTALS].find({"_id": {"$in": names}})}
    projected = {
        d["_id"]: d async for d in generation.queues.find({"_id": {"$in": names}}, {"totals": 1})
    }
    rates = {d["_id"]: d async for d in db[RATES].find({"_id": {"$in": ids}})}
    latency_ids = [f"{i}/{kind}" for i in ids for kind in LATENCY_KINDS]
    latency = {d["_id"]: d async for d in db[LATENCY].find({"_id": {"$in": latency_ids}})}
    items = []
    for queue, rows in zip(names, ids, strict=True):
        ours, theirs = pipeline.get(queue), _totals(projected.get(queue))
        totals = _totals(ours)
        items.append(
            {
                "queue": queue,
                "pipeline": None
                if ours is None
                else {
                    "totals": totals,
                    "by_event": {k: int(v) for k, v in (ours.get("by_event") or {}).items()},
                    "events": int(ours.get("events", 0)),
                    "run_id": ours.get("run_id"),
                },
                "projector": None if theirs is None else {"totals": theirs},
                "agree": totals is not None and totals == theirs,
                "rates": _pick(rates.get(rows), RATE_FIELDS),
                "latency": {
                    kind: _pick(latency.get(f"{rows}/{kind}"), LATENCY_FIELDS)
                    for kind in LATENCY_KINDS
                },
            }
        )
    return header, items, names[-1] if more else None
