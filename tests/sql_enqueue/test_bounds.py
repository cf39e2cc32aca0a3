"""The numbers the SQL functions validate with are the api's: evora.protocol.bounds and the
bounds and defaults of the api's submission model."""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson
from pydantic import BaseModel

from evora.protocol import bounds
from evora.protocol.jobs import Backoff, JobSubmission
from evora.protocol.worker import ErrorBody


def _bounds(model: type[BaseModel], field: str) -> tuple[Any, Any, Any]:
    """(lower bound, upper bound, default) of a model's numeric field."""
    info = model.model_fields[field]
    low = high = None
    for rule in info.metadata:
        low = getattr(rule, "ge", getattr(rule, "gt", low))
        high = getattr(rule, "le", getattr(rule, "lt", high))
    return low, high, info.default


async def test_the_sql_bounds_are_the_apis(app_conn: asyncpg.Connection) -> None:
    sql = orjson.loads(await app_conn.fetchval("SELECT evora.limits()::text"))
    assert sql["queue_pattern"] == bounds.QUEUE_PATTERN
    assert sql["type_pattern"] == bounds.TYPE_PATTERN
    assert sql["key_max_length"] == bounds.KEY_MAX_LENGTH
    assert sql["max_payload_bytes"] == bounds.DEFAULT_MAX_PAYLOAD_BYTES
    assert sql["max_seconds"] == bounds.MAX_SECONDS
    assert sql["max_batch"] == bounds.MAX_BATCH
    assert sql["max_dependencies"] == bounds.MAX_DEPENDENCIES
    assert sql["ref_pattern"] == bounds.REF_PATTERN
    assert sql["limit_key_pattern"] == bounds.LIMIT_KEY_PATTERN
    assert sql["max_limit_keys"] == bounds.MAX_LIMIT_KEYS
    assert sql["max_error_message"] == bounds.MAX_ERROR_MESSAGE
    assert sql["max_error_traceback"] == bounds.MAX_ERROR_TRACEBACK
    assert sql["max_retry_after_seconds"] == bounds.MAX_RETRY_AFTER_SECONDS
    assert sql["max_error_type"] == ErrorBody.model_fields["type"].metadata[0].max_length
    for field in ("priority", "max_attempts", "lease_seconds"):
        low, high, default = _bounds(JobSubmission, field)
        assert (sql[field]["min"], sql[field]["max"], sql[field]["default"]) == (low, high, default)
    for field in ("initial_seconds", "max_seconds", "multiplier"):
        low, high, default = _bounds(Backoff, field)
        assert sql["backoff"][field] == default
        top = sql["backoff"]["max_multiplier"] if field == "multiplier" else sql["max_seconds"]
        assert (low, high) == (1 if field == "multiplier" else 0, top)
    assert _bounds(JobSubmission, "delay_seconds")[:2] == (0, sql["max_seconds"])
    assert _bounds(JobSubmission, "max_duration_seconds") == (1, sql["max_seconds"], None)
    assert JobSubmission.model_fields["payload"].default_factory() == {}  # type: ignore[misc,call-arg]
