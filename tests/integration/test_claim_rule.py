"""What a claim may take is stated once, and both claims take the same jobs.

The plain claim (`claim`) and the limited one (evora.claim_limited(), taken while any flow
limit exists) filter their candidates with evora.claimable(). It must stay a function the
planner inlines: called instead, it would hide its conditions on state, queue and run_at from
the index scan and cost a call per row. An inlined SQL function is never called, so the
function statistics of the transaction (`track_functions = all`) tell: evora.claimable() is
not called, the pause check it leaves to evora.queue_paused() is (once per queue read).

The FIFO group part of the rule is written out in each claim (as a called function it cost
measurably more, see functions/claims_and_transitions.sql): on random job sets (groups with
jobs RUNNING, priorities, due and future jobs, expired time-to-lives, a paused queue, a type
filter, limits with room), both claims must take the same jobs, and the dispatcher's
unclaimed-jobs report (`unclaimed_jobs`, the same rule over every queue) must count exactly
those jobs, per queue and type."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.jobs import JobStore
from evora.storage.limits import LimitSpec, LimitStore
from evora_services.dispatcher.unclaimed import LOOKED_AT_PER_QUEUE
from tests.conftest import Clock

PLANS = ("auto", "force_generic_plan")
SEEDS = range(8)
JOBS_PER_SEED = 60


async def _claim(
    conn: asyncpg.Connection, queues: list[str], types: list[str] | None
) -> tuple[set[str], dict[str, int]]:
    """The ids a claim of everything it may take would take (rolled back), and the functions
    it called."""
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute("SET LOCAL track_functions = 'all'")
        claimed = await conn.fetch(queries.CLAIM, queues, types, 1000, "me")
        calls = {
            r["funcname"]: r["calls"]
            for r in await conn.fetch("SELECT funcname, calls FROM pg_stat_xact_user_functions")
        }
    finally:
        await tx.rollback()
    return {str(r["job"]["id"]) for r in claimed}, calls


async def test_both_claims_inline_the_rule_and_take_the_same_jobs(
    store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    submitted_at = datetime.now(UTC)
    cases: list[tuple[list[str], list[str] | None]] = []
    for seed in SEEDS:
        rng = random.Random(seed)
        queues = [f"s{seed}-a", f"s{seed}-b"]
        await store.submit_batch(
            [
                JobSubmission(
                    queue=rng.choice(queues),
                    type=rng.choice(("x", "y")),
                    priority=rng.choice((-1, 0, 0, 2)),
                    group_key=rng.choice((None, None, "g1", "g2", "g3")),
                    delay_seconds=rng.choice((None, None, 30.0, 120.0)),
                    expires_at=rng.choice(
                        (
                            None,
                            None,
                            submitted_at + timedelta(seconds=60),
                            submitted_at + timedelta(seconds=600),
                        )
                    ),
                    limit_keys=rng.choice(([], ["tenant:a"], ["tenant:b"])),
                )
                for _ in range(JOBS_PER_SEED)
            ]
        )
        # a few jobs RUNNING (grouped ones among them block their groups)
        await store.claim(worker_id="others", queues=[queues[0]], max_jobs=rng.randint(0, 3))
        if rng.random() < 0.3:
            await store.pause(queues[1])
        cases.append((queues, rng.choice((None, ["x"]))))
    # the delayed by 30 s are due, the delayed by 120 s not; the TTLs of 60 s ran out
    await clock.advance(90)

    plain: list[set[str]] = []
    limited: list[set[str]] = []
    calls: list[dict[str, int]] = []
    async with pool.acquire() as conn:
        for plans in PLANS:
            await conn.execute(f"SET plan_cache_mode = {plans}")
            for queues, types in cases:
                ids, called = await _claim(conn, queues, types)
                plain.append(ids)
                calls.append(called)
        # limits with room for every job: the limited claim, taking what the plain one takes
        await LimitStore(pool).put("tenant:*", LimitSpec(concurrency=1000, rate=None))
        for plans in PLANS:
            await conn.execute(f"SET plan_cache_mode = {plans}")
            for queues, types in cases:
                ids, called = await _claim(conn, queues, types)
                limited.append(ids)
                calls.append(called)
        # what the report counts as due and unclaimed, per queue and type, and what the plain
        # claims of every type took
        # (every queue has fewer jobs than the report looks at: each count is exact)
        report = await conn.fetch(queries.UNCLAIMED_JOBS, 0, 1000, LOOKED_AT_PER_QUEUE)
        reported = {(r["queue"], r["type"]): r["pending"] for r in report}
        taken = [
            ids
            for (queues, types), ids in zip(cases, plain[: len(cases)], strict=True)
            if types is None
        ]
        counted = {
            (r["queue"], r["type"]): r["n"]
            for r in await conn.fetch(
                "SELECT queue, type, count(*) AS n FROM evora.jobs WHERE id::text = ANY($1)"
                " GROUP BY queue, type",
                [i for ids in taken for i in ids],
            )
        }
        unfiltered = {q for (queues, types) in cases if types is None for q in queues}
        left_out = await conn.fetchval(
            "SELECT count(*) FROM evora.jobs WHERE state = 'PENDING' AND NOT id::text = ANY($1)",
            [i for ids in plain for i in ids],
        )
    assert plain == limited
    assert not any(r["at_least"] for r in report)
    assert {key: n for key, n in reported.items() if key[0] in unfiltered} == counted
    assert counted, "no case without a type filter: the report was compared with nothing"
    # the sets are neither empty nor everything: the rule left jobs out
    assert all(plain) and left_out > 0
    print(f"function calls of the claims: {calls}")
    for called in calls:
        assert "claimable" not in called
        assert called.get("queue_paused", 0) >= 1
