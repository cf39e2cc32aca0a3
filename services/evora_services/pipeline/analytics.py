"""The analytics `evora pipeline run` computes: pure DataFrame to DataFrame functions, no I/O.

Every output is per queue and per job type, plus one row per queue with type "*" for all
types together (job types cannot contain "*", so it is unambiguous). Counts are additive,
so the "*" rows are sums over the types; percentiles are not, so latency is aggregated with
a rollup instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from evora.readmodels.analytics import ALL_TYPES
from evora.readmodels.layout import TOTAL_KEYS

PERCENTILES = (0.5, 0.9, 0.95, 0.99)
# Relative error of percentile_approx is about 1/accuracy.
PERCENTILE_ACCURACY = 10_000
# Events counted per minute and per hour.
THROUGHPUT_EVENTS = ("submitted", "claimed", "completed", "failed", "dead_lettered")
# Events that send a job back to PENDING after an attempt that did not succeed.
RETRY_EVENTS = ("failed", "lease_expired")
# As the projector keys failure reasons: the first 200 characters of the message.
MESSAGE_CHARS = 200

# The key columns of each output: its Parquet rows and MongoDB documents are unique by them.
KEYS: dict[str, tuple[str, ...]] = {
    "queue_totals": ("queue",),
    "event_totals": ("queue", "type", "event"),
    "job_states": ("queue", "type", "state"),
    "throughput_minute": ("queue", "type", "minute"),
    "throughput_hour": ("queue", "type", "hour"),
    "latency": ("queue", "type", "kind"),
    "rates": ("queue", "type"),
    "failure_reasons": ("queue", "type", "rank"),
}


def _is(*events: str) -> Column:
    return F.col("event").isin(*events)


def _count_if(condition: Column) -> Column:
    return F.sum(F.when(condition, 1).otherwise(0))


def _millis(later: Column, earlier: Column) -> Column:
    return (F.unix_micros(later) - F.unix_micros(earlier)) / 1000.0


def with_all_types(
    df: DataFrame, keys: Sequence[str], sums: Sequence[str], maxes: Sequence[str] = ()
) -> DataFrame:
    """`df` (grouped by queue, type and `keys`) plus its sums over the types, as type "*"."""
    rolled = df.groupBy("queue", *keys).agg(
        *(F.sum(c).alias(c) for c in sums), *(F.max(c).alias(c) for c in maxes)
    )
    return df.unionByName(rolled.withColumn("type", F.lit(ALL_TYPES)))


def per_job(events: DataFrame) -> DataFrame:
    """One row per job: where it is now (its last event's state), when it was submitted,
    first and last claimed and completed, how often it was retried, whether it was ever
    dead-lettered."""
    return events.groupBy("job_id").agg(
        # constant per job; max() is a deterministic way to take it
        F.max("queue").alias("queue"),
        F.max("type").alias("type"),
        F.max_by("to_state", "seq").alias("state"),
        F.min(F.when(_is("submitted"), F.col("at"))).alias("submitted_at"),
        F.min(F.when(_is("claimed"), F.col("at"))).alias("first_claimed_at"),
        F.max(F.when(_is("claimed"), F.col("at"))).alias("last_claimed_at"),
        F.min(F.when(_is("completed"), F.col("at"))).alias("completed_at"),
        _count_if(_is(*RETRY_EVENTS)).alias("retries"),
        F.max(F.when(_is("dead_lettered"), 1).otherwise(0)).alias("dead_lettered"),
    )


def event_totals(events: DataFrame) -> DataFrame:
    counted = events.groupBy("queue", "type", "event").agg(F.count(F.lit(1)).alias("events"))
    return with_all_types(counted, ("event",), ("events",))


def queue_totals(totals: DataFrame) -> DataFrame:
    """The documented `analytics_queue_totals` (services/evora_services/pipeline/README.md), from
    `event_totals`: the stats `totals` keys (0 when an event never happened), and every event
    name in `by_event`."""
    per_queue = totals.where(F.col("type") == ALL_TYPES)
    return per_queue.groupBy("queue").agg(
        F.struct(
            *(F.sum(F.when(_is(k), F.col("events")).otherwise(0)).alias(k) for k in TOTAL_KEYS)
        ).alias("totals"),
        F.map_from_entries(F.collect_list(F.struct("event", "events"))).alias("by_event"),
        F.sum("events").alias("events"),
    )


def job_states(jobs: DataFrame) -> DataFrame:
    counted = jobs.groupBy("queue", "type", "state").agg(F.count(F.lit(1)).alias("jobs"))
    return with_all_types(counted, ("state",), ("jobs",))


def throughput(events: DataFrame, unit: str) -> DataFrame:
    """Events per `unit` ("minute" or "hour") bucket."""
    counted = (
        events.where(_is(*THROUGHPUT_EVENTS))
        .groupBy("queue", "type", F.date_trunc(unit, "at").alias(unit))
        .agg(*(_count_if(_is(name)).alias(name) for name in THROUGHPUT_EVENTS))
    )
    return with_all_types(counted, (unit,), THROUGHPUT_EVENTS)


def hourly(per_minute: DataFrame) -> DataFrame:
    """`throughput(..., "minute")` summed per hour (cheaper than another pass over events)."""
    return per_minute.groupBy("queue", "type", F.date_trunc("hour", "minute").alias("hour")).agg(
        *(F.sum(name).alias(name) for name in THROUGHPUT_EVENTS)
    )


def latency(jobs: DataFrame) -> DataFrame:
    """Percentiles in milliseconds of wait (submitted to first claim) and run (claim to
    completion: COMPLETED is final, so the completing attempt is the job's last claim),
    per job, from `per_job`."""
    waits = jobs.where(F.col("first_claimed_at").isNotNull() & F.col("submitted_at").isNotNull())
    runs = jobs.where(F.col("completed_at").isNotNull() & F.col("last_claimed_at").isNotNull())
    samples = waits.select(
        F.lit("wait").alias("kind"),
        "queue",
        "type",
        _millis(F.col("first_claimed_at"), F.col("submitted_at")).alias("ms"),
    ).unionByName(
        runs.select(
            F.lit("run").alias("kind"),
            "queue",
            "type",
            _millis(F.col("completed_at"), F.col("last_claimed_at")).alias("ms"),
        )
    )
    quantiles = F.percentile_approx("ms", list(PERCENTILES), PERCENTILE_ACCURACY)
    rolled = (
        samples.rollup("kind", "queue", "type")
        .agg(
            F.count(F.lit(1)).alias("samples"),
            quantiles.alias("q"),
            F.avg("ms").alias("mean_ms"),
            F.max("ms").alias("max_ms"),
        )
        .where(F.col("kind").isNotNull() & F.col("queue").isNotNull())
    )
    names = [f"p{round(p * 100)}_ms" for p in PERCENTILES]
    return rolled.select(
        "queue",
        F.coalesce(F.col("type"), F.lit(ALL_TYPES)).alias("type"),
        "kind",
        "samples",
        *(F.col("q")[i].alias(name) for i, name in enumerate(names)),
        "mean_ms",
        "max_ms",
    )


def rates(jobs: DataFrame) -> DataFrame:
    """Retry rate: jobs retried at least once (failed or lease expired, then requeued) per
    job. DLQ rate: jobs dead-lettered at least once per job."""
    counted = jobs.groupBy("queue", "type").agg(
        F.count(F.lit(1)).alias("jobs"),
        _count_if(F.col("retries") > 0).alias("retried_jobs"),
        F.sum("retries").alias("retries"),
        F.sum("dead_lettered").alias("dead_lettered_jobs"),
    )
    both = with_all_types(counted, (), ("jobs", "retried_jobs", "retries", "dead_lettered_jobs"))
    return both.withColumn("retry_rate", F.col("retried_jobs") / F.col("jobs")).withColumn(
        "dlq_rate", F.col("dead_lettered_jobs") / F.col("jobs")
    )


def failure_reasons(events: DataFrame, top: int) -> DataFrame:
    """The `top` most frequent (error type, message) pairs of the events that carry an error
    (failed, dead-lettered or cancelled attempts), ranked 1..top."""
    failed = events.where(F.get_json_object("data", "$.error").isNotNull()).select(
        "queue",
        "type",
        F.get_json_object("data", "$.error.type").alias("error_type"),
        F.substring(
            F.coalesce(F.get_json_object("data", "$.error.message"), F.lit("")), 1, MESSAGE_CHARS
        ).alias("message"),
        "at",
    )
    counted = failed.groupBy("queue", "type", "error_type", "message").agg(
        F.count(F.lit(1)).alias("failures"), F.max("at").alias("last_at")
    )
    both = with_all_types(counted, ("error_type", "message"), ("failures",), ("last_at",))
    order = Window.partitionBy("queue", "type").orderBy(
        F.col("failures").desc(), F.col("message"), F.col("error_type").asc_nulls_first()
    )
    return both.withColumn("rank", F.row_number().over(order)).where(F.col("rank") <= top)
