"""What an event looks like to the pipeline, and which events a slice of history holds.

The archive holds a rectangle of events: every event with `seq <= upto_seq` and
`xid < below_xid` (migration 0004 says why it is not a plain seq prefix). Each archive run
adds the difference between the old rectangle and a larger one, and `pipeline run` reads
the live remainder as the difference between the archived rectangle and the outbox
horizon. Both are the same query: `between(inner, outer)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from pyspark.sql.types import (
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# Larger than any seq; the outer bound of "everything below the horizon".
MAX_SEQ = 2**63 - 1

# jsonb, uuid, xid8, the job_state enum and the job_image row as types Spark's JDBC reader
# knows (the image as the JSON document it was before migration 0007).
_SELECT = """seq, xid::text::int8 AS xid, job_id::text AS job_id, job_version, queue, type,
       event, from_state::text AS from_state, to_state::text AS to_state, attempt,
       worker_id, at, data::text AS data, to_jsonb(job)::text AS job"""

EVENT_SCHEMA = StructType(
    [
        StructField("seq", LongType(), False),
        StructField("xid", LongType(), False),
        StructField("job_id", StringType(), False),
        StructField("job_version", IntegerType(), False),
        StructField("queue", StringType(), False),
        StructField("type", StringType(), False),
        StructField("event", StringType(), False),
        StructField("from_state", StringType(), True),
        StructField("to_state", StringType(), False),
        StructField("attempt", IntegerType(), False),
        StructField("worker_id", StringType(), True),
        StructField("at", TimestampType(), False),
        # JSON text, exactly as PostgreSQL renders jsonb
        StructField("data", StringType(), False),
        StructField("job", StringType(), False),
    ]
)

EVENT_COLUMNS = tuple(field.name for field in EVENT_SCHEMA.fields)

# As stored in the archive: plus the UTC day it is partitioned by (date=YYYY-MM-DD).
ARCHIVE_SCHEMA = StructType([*EVENT_SCHEMA.fields, StructField("date", DateType(), False)])


@dataclass(frozen=True, order=True)
class Rectangle:
    """Events with seq <= upto_seq and xid < below_xid. (0, 0) holds nothing."""

    upto_seq: int = 0
    below_xid: int = 0

    def contains(self, other: Rectangle) -> bool:
        return self.upto_seq >= other.upto_seq and self.below_xid >= other.below_xid

    def as_doc(self) -> dict[str, int]:
        return {"upto_seq": self.upto_seq, "below_xid": self.below_xid}


def between(inner: Rectangle, outer: Rectangle) -> str:
    """SQL for the events in `outer` but not in `inner` (outer must contain inner), as two
    disjoint range scans: new sequence numbers (evora.events_between(): the BRIN indexes on
    seq; through the `job_events` view a filter on seq reaches no index of the batches), and
    late transactions below the old seq bound (the tail indexes on xid)."""
    return between_parts(inner, outer, 1, 0, 0)[0]


def between_parts(
    inner: Rectangle, outer: Rectangle, parts: int, lower: int, upper: int
) -> list[str]:
    """`between(inner, outer)` as `parts` disjoint queries, for as many concurrent reads: the
    new seqs' range cut in even steps of [lower, upper] (the first part open down to the
    range's start and the last up to its end, so bounds that are off lose nothing), the late
    transactions read with the first part. Each part's range is evora.events_between()'s own:
    a filter on seq around one range would reach no index of the batches, so every reader
    would unfold the whole range's batches to keep its share."""
    if not outer.contains(inner):
        raise ValueError(f"{outer} does not contain {inner}")
    # [lo, hi) in bigint: MAX_SEQ itself, the horizon's bound, is no seq an event has
    lo, hi = min(inner.upto_seq + 1, MAX_SEQ), min(outer.upto_seq + 1, MAX_SEQ)
    # the cuts spread over the part of [lower, upper] that is new seqs
    start, end = max(lower, lo), min(upper + 1, hi)
    step = max(1, (end - start) // max(1, parts))
    edges = sorted({lo, hi, *(min(start + step * k, hi) for k in range(1, parts))})
    queries = [
        f"""SELECT {_SELECT}
FROM evora.events_between({a}, {b})
WHERE xid < '{outer.below_xid}'::xid8"""
        for a, b in list(pairwise(edges)) or [(lo, hi)]
    ]
    if inner.upto_seq == 0:
        return queries  # no seq is 0 or below: nothing is late
    # Late transactions, found by xid: the tail indexes read every batch of the transactions
    # since the old rectangle's xid bound once (of those the seq filter keeps the late), not
    # once per part.
    queries[0] += f"""
UNION ALL
SELECT {_SELECT} FROM evora.job_events
WHERE seq <= {inner.upto_seq}
  AND xid >= '{inner.below_xid}'::xid8 AND xid < '{outer.below_xid}'::xid8"""
    return queries
