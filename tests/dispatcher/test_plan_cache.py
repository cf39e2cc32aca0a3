"""The dispatcher plans each statement once per connection, not on every call (issue 33).

Under PostgreSQL's default plan_cache_mode (`auto`) a prepared statement gets a custom plan,
made for its parameters' values, on each of its first five runs, and after them whenever
the custom plans look cheaper than the generic one, which a `LIMIT $n` or an array parameter
makes them do on every call: a one-job claim spent more on planning than on running. The
dispatcher's pool runs with force_generic_plan (db.session_settings); that its statements
stay cheap under generic plans is tests/integration/test_generic_plans.py. Counted here from
the sessions' own record of their prepared statements (pg_prepared_statements: how many
times each ran under a generic plan, and how many under a custom one)."""

from __future__ import annotations

import asyncio

from evora.storage import queries
from evora.storage.jobs import JobStore
from tests.dispatcher.conftest import Dispatcher
from tests.dispatcher.test_worker_api import claim, submit

CALLS = 8  # more than the five custom plans `auto` makes in any case


async def test_the_claim_and_the_heartbeat_run_under_one_generic_plan_per_connection(
    dispatcher: Dispatcher, store: JobStore
) -> None:
    for _ in range(CALLS):
        await submit(store)
    for _ in range(CALLS):
        [job] = await claim(dispatcher, max_jobs=1)
        status, _ = await dispatcher.post(
            f"/v1/jobs/{job['id']}/heartbeat", {"lease_token": job["lease_token"]}
        )
        assert status == 200
    # every connection of the dispatcher's pool at once, each asked about its own statements
    pool = dispatcher.state.store.pool
    conns = [await pool.acquire() for _ in range(pool.get_size())]
    try:
        rows = await asyncio.gather(
            *(
                conn.fetch(
                    "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement = ANY($1::text[])",
                    [queries.CLAIM, queries.HEARTBEAT],
                )
                for conn in conns
            )
        )
    finally:
        for conn in conns:
            await pool.release(conn)
    plans = {
        name: [
            sum(r[kind] for per_conn in rows for r in per_conn if r["statement"] == statement)
            for kind in ("generic_plans", "custom_plans")
        ]
        for name, statement in (("claim", queries.CLAIM), ("heartbeat", queries.HEARTBEAT))
    }
    assert plans == {"claim": [CALLS, 0], "heartbeat": [CALLS, 0]}
