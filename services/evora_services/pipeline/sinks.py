"""Where `pipeline run` puts its outputs: Parquet, then MongoDB from the Parquet.

MongoDB is written from the executors (`foreachPartition`, one pymongo client per partition,
bulk upserts keyed by the output's key columns), never by collecting on the driver; there is
no MongoDB Spark connector to use offline (no jar on PyPI, Maven unreachable). Upserts make a
re-run idempotent; afterwards the driver deletes the documents an earlier run wrote that
this one did not (a key that no longer exists), so each collection equals its Parquet.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import MongoClient, ReplaceOne
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

log = logging.getLogger(__name__)

BULK_SIZE = 1000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class MongoTarget:
    url: str
    database: str

    def client(self) -> MongoClient[dict[str, Any]]:
        return MongoClient(
            self.url,
            tz_aware=True,
            appname="evora-pipeline",
            serverSelectionTimeoutMS=_TIMEOUT_MS,
            socketTimeoutMS=_TIMEOUT_MS,
        )


def document_id(values: Sequence[Any]) -> str:
    # Queue names and types cannot contain "/", so joining is unambiguous.
    return "/".join(v.isoformat() if isinstance(v, datetime) else str(v) for v in values)


@dataclass(frozen=True)
class PartitionWriter:
    """What each executor runs over its rows. A plain picklable object: Spark ships it to
    the Python workers, which connect on their own (no client crosses the wire)."""

    target: MongoTarget
    collection: str
    keys: tuple[str, ...]
    # columns that travel as microseconds since the epoch and become UTC datetimes here:
    # PySpark would hand timestamps over as naive datetimes in the worker's local zone
    timestamps: tuple[str, ...]
    stamp: Mapping[str, Any] = field(default_factory=dict)

    def document(self, row: Row) -> dict[str, Any]:
        doc: dict[str, Any] = row.asDict(recursive=True)
        for name in self.timestamps:
            micros = doc.get(name)
            if micros is not None:
                doc[name] = _EPOCH + timedelta(microseconds=micros)
        doc["_id"] = document_id([doc[k] for k in self.keys])
        doc.update(self.stamp)
        return doc

    def __call__(self, rows: Iterator[Row]) -> None:
        with self.target.client() as client:
            collection = client[self.target.database][self.collection]
            batch: list[ReplaceOne[dict[str, Any]]] = []
            for row in rows:
                doc = self.document(row)
                batch.append(ReplaceOne({"_id": doc["_id"]}, doc, upsert=True))
                if len(batch) >= BULK_SIZE:
                    collection.bulk_write(batch, ordered=False)
                    batch = []
            if batch:
                collection.bulk_write(batch, ordered=False)


def write_parquet(df: DataFrame, url: str) -> None:
    df.write.mode("overwrite").parquet(url)


def write_mongo(
    df: DataFrame,
    target: MongoTarget,
    collection: str,
    keys: Sequence[str],
    run_id: str,
    as_of: Mapping[str, Any],
) -> int:
    """Upsert every row of `df` as one document, then drop the collection's documents from
    other runs. Returns how many documents were dropped."""
    timestamps = tuple(f.name for f in df.schema.fields if isinstance(f.dataType, TimestampType))
    prepared = df.select(
        *(F.unix_micros(F.col(c)).alias(c) if c in timestamps else F.col(c) for c in df.columns)
    )
    stamp = {"run_id": run_id, "as_of": dict(as_of)}
    prepared.foreachPartition(PartitionWriter(target, collection, tuple(keys), timestamps, stamp))
    with target.client() as client:
        stale = client[target.database][collection].delete_many({"run_id": {"$ne": run_id}})
    return int(stale.deleted_count)
