"""What a claim may take is stated once, in evora_claimable(), and both claims use it inline.

The plain claim (`claim`) and the limited one (evora_claim_limited(), taken while any flow
limit exists) both filter their candidates with evora_claimable(). It must stay a function the
planner inlines: called instead, it would hide its conditions on state, queue and run_at from
the index scan and cost a call per row. An inlined SQL function is never called, so the
function statistics of the transaction (`track_functions = all`) tell: evora_claimable() is
not called, the group check it leaves to evora_group_turn() is, once per grouped candidate."""

from __future__ import annotations

import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.jobs import JobStore
from evora.storage.limits import LimitSpec, LimitStore

PATHS = ("plain", "limited")
PLANS = ("auto", "force_generic_plan")


async def test_both_claims_inline_the_one_rule(store: JobStore, pool: asyncpg.Pool) -> None:
    # two jobs of each of two groups, then two without a group: the claim may take the heads
    # and the ungrouped jobs, never the second job of a group
    await store.submit_batch(
        [JobSubmission(queue="q", type="t", group_key=g) for g in ("a", "b", "a", "b")]
        + [JobSubmission(queue="q", type="t") for _ in range(2)]
    )
    calls: dict[tuple[str, str], dict[str, int]] = {}
    async with pool.acquire() as conn:
        for path in PATHS:
            if path == "limited":
                # a limit that governs no job of "q": the claim only takes the other path
                await LimitStore(pool).put("tenant:*", LimitSpec(concurrency=1, rate=None))
            for plans in PLANS:
                await conn.execute(f"SET plan_cache_mode = {plans}")
                tx = conn.transaction()
                await tx.start()
                try:
                    await conn.execute("SET LOCAL track_functions = 'all'")
                    claimed = await conn.fetch(queries.CLAIM, ["q"], None, 10, "me")
                    calls[path, plans] = {
                        r["funcname"]: r["calls"]
                        for r in await conn.fetch(
                            "SELECT funcname, calls FROM pg_stat_xact_user_functions"
                        )
                    }
                finally:
                    await tx.rollback()
                assert sorted(r["job"]["group_key"] or "" for r in claimed) == ["", "", "a", "b"]
    print(f"function calls of each claim: {calls}")
    for path_calls in calls.values():
        assert "evora_claimable" not in path_calls
        # each grouped job read once (the heads and the jobs behind them)
        assert path_calls.get("evora_group_turn", 0) >= 2
