"""A failure's stack trace, as a worker reports it: accepted by the dispatcher, kept (its
end, bounded) in the job's last error and the failure event, never refused for its text."""

from __future__ import annotations

from uuid import UUID

import asyncpg

from evora.protocol.bounds import MAX_ERROR_TRACEBACK
from evora.storage.jobs import JobStore
from tests.dispatcher.conftest import Dispatcher
from tests.dispatcher.test_worker_api import claim, submit

# The innermost frame and the exception come last in a Python trace.
TRACE = "Traceback (most recent call last):\n" + '  File "app.py", line 1, in f\n' * 2000
END = "  File \"handler.py\", line 9, in run\n    raise KeyError(k)\nKeyError: 'a\x00b'\n"


async def test_a_long_trace_keeps_its_end(
    dispatcher: Dispatcher, store: JobStore, pool: asyncpg.Pool
) -> None:
    job_id = await submit(store, max_attempts=1)
    [job] = await claim(dispatcher)
    error = {"message": "'a'", "type": "KeyError", "traceback": TRACE + END}
    status, failed = await dispatcher.post(
        f"/v1/jobs/{job_id}/fail", {"lease_token": job["lease_token"], "error": error}
    )
    assert status == 200, failed
    kept = failed["last_error"]["traceback"]
    assert len(kept) == MAX_ERROR_TRACEBACK
    assert kept.endswith("raise KeyError(k)\nKeyError: 'a\ufffdb'\n")

    stored = await store.get(UUID(job_id))
    assert stored["state"] == "DLQ" and stored["last_error"]["traceback"] == kept
    event = await pool.fetchval(
        "SELECT data->'error'->>'traceback' FROM evora.job_events WHERE job_id = $1"
        " AND event = 'dead_lettered'",
        stored["id"],
    )
    assert event == kept


async def test_a_failure_without_a_trace_stores_none(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    job_id = await submit(store, max_attempts=1)
    [job] = await claim(dispatcher)
    error = {"message": "boom", "type": "E"}
    status, failed = await dispatcher.post(
        f"/v1/jobs/{job_id}/fail", {"lease_token": job["lease_token"], "error": error}
    )
    assert status == 200 and failed["last_error"] == {"message": "boom", "type": "E"}
