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
EVENT_TOTALS = COLLECTION_PREFIX + "event_totals"
JOB_STATES = COLLECTION_PREFIX + "job_states"
FAILURE_REASONS = COLLECTION_PREFIX + "failure_reasons"
# The pipeline's rows for all of a queue's types together (job types cannot contain "*").
ALL_TYPES = "*"
LATENCY_KINDS = ("wait", "run")
RATE_FIELDS = ("jobs", "retried_jobs", "retries", "dead_lettered_jobs", "retry_rate", "dlq_rate")
LATENCY_FIELDS = ("samples", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms", "max_ms")
REASON_FIELDS = ("rank", "error_type", "message", "failures", "last_at")
# Documents are keyed "<queue>/<type>[/...]" and names cannot hold "/": the documents under
# a key prefix P are exactly the ids from "P/" up to "P0" ("0" follows "/"), a range the
# _id index serves.
_PAST_SLASH = "0"


def _under(prefix: str, after: str | None = None) -> dict[str, Any]:
    """The ids below `prefix` (after `prefix/after`, if given)."""
    return {"$gt": f"{prefix}/{after or ''}", "$lt": prefix + _PAST_SLASH}


def _as_of(doc: Document) -> dict[str, Any]:
    as_of: dict[str, Any] = dict(doc.get("as_of") or {})
    as_of["at"] = as_utc(as_of.get("at"))
    return as_of


async def _latest_run(db: AsyncDatabase[Document]) -> dict[str, Any]:
    # While a run writes, documents of two runs coexist: the newest run is the one shown.
    newest = await db[QUEUE_TOTALS].find_one({}, {"as_of": 1}, sort=[("as_of.at", -1)])
    return {"ran": newest is not None, "as_of": None if newest is None else _as_of(newest)}


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
    header = {**await _latest_run(db), "projector_as_of": projector_as_of}
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


async def _by_type(
    db: AsyncDatabase[Document], collection: str, queue: str, types: list[str]
) -> dict[str, list[Document]]:
    """The documents of `collection` under each of the queue's `types`."""
    found: dict[str, list[Document]] = {t: [] for t in types}
    if types:  # ($or refuses an empty list)
        ranges = [{"_id": _under(f"{queue}/{t}")} for t in types]
        async for doc in db[collection].find({"$or": ranges}).sort("_id", 1):
            found[doc["type"]].append(doc)
    return found


async def queue_types_page(
    db: AsyncDatabase[Document], queue: str, *, limit: int, after: str | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]], str | None]:
    """The latest run's `as_of` and a page of the queue's job types (`*` first: all types
    together), each with its events by name, jobs by state, rates, latency and top failure
    reasons; and the last type when more follow."""
    cursor = db[RATES].find({"_id": _under(queue, after)}).sort("_id", 1).limit(limit + 1)
    rates = [doc async for doc in cursor]
    types = [doc["type"] for doc in rates[:limit]]
    latency_ids = [f"{queue}/{t}/{kind}" for t in types for kind in LATENCY_KINDS]
    latency = {d["_id"]: d async for d in db[LATENCY].find({"_id": {"$in": latency_ids}})}
    events = await _by_type(db, EVENT_TOTALS, queue, types)
    states = await _by_type(db, JOB_STATES, queue, types)
    reasons = await _by_type(db, FAILURE_REASONS, queue, types)
    items = [
        {
            "type": t,
            "events": {d["event"]: int(d["events"]) for d in events[t]},
            "jobs": {d["state"]: int(d["jobs"]) for d in states[t]},
            "rates": _pick(rate, RATE_FIELDS),
            "latency": {
                kind: _pick(latency.get(f"{queue}/{t}/{kind}"), LATENCY_FIELDS)
                for kind in LATENCY_KINDS
            },
            "failure_reasons": [
                {**(_pick(d, REASON_FIELDS) or {}), "last_at": as_utc(d.get("last_at"))}
                for d in sorted(reasons[t], key=lambda d: int(d["rank"]))
            ],
        }
        for t, rate in zip(types, rates[:limit], strict=True)
    ]
    return await _latest_run(db), items, types[-1] if len(rates) > limit else None
