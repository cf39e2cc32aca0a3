"""Weighted fair scheduling across fairness keys (docs/flow-control.md, "Fairness keys"):
the claim of a queue with keyed jobs serves its keys by virtual time, in proportion to their
weights, charged with the lease time their attempts held; exactly, however many claimers run
at once."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage import queries
from evora.storage.fairness import FairnessStore
from evora.storage.jobs import Failure, JobStore
from evora.storage.limits import LimitSpec, LimitStore
from tests.conftest import Clock
from tests.polling import waits_for_a_lock

Q = "fair"


async def _submit(store: JobStore, key: str, count: int, queue: str = Q) -> None:
    await store.submit_batch(
        [JobSubmission(queue=queue, type="t", fairness_key=key) for _ in range(count)]
    )


def _keys(jobs: list[asyncpg.Record] | list[dict[str, Any]]) -> list[str]:
    return [j["fairness_key"] for j in jobs]


async def _claim(store: JobStore, max_jobs: int = 1) -> list[dict[str, Any]]:
    return await store.claim(worker_id="w", queues=[Q], max_jobs=max_jobs)


async def _served(pool: asyncpg.Pool) -> Counter[str]:
    rows = await pool.fetch(
        "SELECT fairness_key, count(*) AS n FROM evora.jobs WHERE state = 'RUNNING' "
        "GROUP BY fairness_key"
    )
    return Counter({r["fairness_key"]: r["n"] for r in rows})


async def test_concurrent_claimers_serve_keys_in_proportion_to_their_weights(
    pool: asyncpg.Pool, store: JobStore
) -> None:
    weights = FairnessStore(pool)
    await weights.put("gold", 3)
    await weights.put("tier:*", 2)  # tier:a weighs 2, on its own
    for key in ("gold", "tier:a", "plain"):
        await _submit(store, key, 200)

    # 8 claimers at once, 3 jobs a claim, none completed: every key is charged its estimate
    # (the same for all), so the shares are the weights'. 240 of the 600 jobs.
    async def claimer() -> None:
        for _ in range(10):
            await _claim(store, max_jobs=3)

    await asyncio.gather(*(claimer() for _ in range(8)))
    served = await _served(pool)
    assert sum(served.values()) == 240
    # ideal 120 : 80 : 40; start-time fair queuing is off by at most about one job per key
    # and claim (the tags are taken 3 at a time)
    assert abs(served["gold"] - 120) <= 4, served
    assert abs(served["tier:a"] - 80) <= 4, served
    assert abs(served["plain"] - 40) <= 4, served


async def test_a_claim_waiting_for_another_chooses_after_it_committed(
    db_url: str, pool: asyncpg.Pool, store: JobStore
) -> None:
    await _submit(store, "a", 10)
    await _submit(store, "b", 10)
    # a's first job: a is one job ahead of b in virtual time (and the submissions' ledger
    # is folded, so the claim below changes nothing a later claim would wait for but the
    # queue's row and the keys it serves)
    assert _keys(await _claim(store)) == ["a"]
    early = await asyncpg.connect(db_url)
    try:
        held = early.transaction()
        await held.start()
        first = await early.fetch(queries.CLAIM, [Q], None, 1, "early")
        assert [r["job"]["fairness_key"] for r in first] == ["b"]
        # a second claimer starts while the first is still open, at the unlucky moment: the
        # virtual times it must choose by are the ones the first is about to commit
        late = asyncio.create_task(_claim(store))
        await waits_for_a_lock(pool)
        assert not late.done()  # it waits for the queue's turn
        await held.commit()
        second = await asyncio.wait_for(late, 10)
    finally:
        await early.close()
    # both keys are one job in now: a's next is first in line (submitted first). A claim that
    # read the virtual times before the first committed would take b's job the first holds
    # (and skip it: nothing) or b's next.
    assert _keys(second) == ["a"]


async def test_a_key_is_charged_the_lease_time_its_attempts_held(
    pool: asyncpg.Pool, store: JobStore, clock: Clock
) -> None:
    await _submit(store, "slow", 20)
    await _submit(store, "fast", 20)
    slow, fast = await _claim(store, max_jobs=2)
    assert {slow["fairness_key"], fast["fairness_key"]} == {"slow", "fast"}
    if slow["fairness_key"] != "slow":
        slow, fast = fast, slow
    await store.complete(job_id=fast["id"], lease_token=fast["lease_token"], result=None)
    await clock.advance(10)  # the slow attempt holds its lease 10 s
    await store.complete(job_id=slow["id"], lease_token=slow["lease_token"], result=None)
    # slow owes ~10 s of virtual time, fast ~0: fast is served until it has used as much
    nxt = _keys(await _claim(store, max_jobs=8))
    assert nxt == ["fast"] * 8, nxt


async def test_a_key_without_backlog_saves_no_credit(pool: asyncpg.Pool, store: JobStore) -> None:
    await _submit(store, "busy", 60)
    # busy is served alone for a while: 30 jobs
    for _ in range(10):
        await _claim(store, max_jobs=3)
    # idle meanwhile, `late` arrives: it starts at the queue's virtual time, not at 0, so it
    # shares from now on instead of taking the next 30 claims
    await _submit(store, "late", 30)
    nxt = Counter(_keys(await _claim(store, max_jobs=20)))
    assert abs(nxt["late"] - 10) <= 1 and abs(nxt["busy"] - 10) <= 1, nxt


async def test_unkeyed_queues_keep_the_unkeyed_claim(pool: asyncpg.Pool, store: JobStore) -> None:
    await store.submit_batch([JobSubmission(queue="plain", type="t") for _ in range(3)])
    await _submit(store, "a", 1)
    claimed = await store.claim(worker_id="w", queues=["plain"], max_jobs=3)
    assert len(claimed) == 3
    assert await pool.fetchval("SELECT array_agg(queue) FROM evora.fair_queues") == [Q]


async def test_a_fair_queue_serves_unkeyed_jobs_when_its_keys_have_none(
    pool: asyncpg.Pool, store: JobStore
) -> None:
    await _submit(store, "a", 2)
    await store.submit_batch([JobSubmission(queue=Q, type="t") for _ in range(2)])
    claimed = await _claim(store, max_jobs=4)
    assert sorted(_keys(claimed), key=str) == sorted(["a", "a", None, None], key=str)


async def test_evora_submit_takes_the_fairness_key(pool: asyncpg.Pool, store: JobStore) -> None:
    job_id = await pool.fetchval(
        "SELECT evora.submit($1, 't', '{}', '{\"fairness_key\": \"tenant:sql\"}')", Q
    )
    assert await pool.fetchval("SELECT fairness_key FROM evora.jobs WHERE id = $1", job_id) == (
        "tenant:sql"
    )
    assert _keys(await _claim(store)) == ["tenant:sql"]
    with pytest.raises(asyncpg.InvalidParameterValueError, match="fairness_key"):
        await pool.fetchval("SELECT evora.submit($1, 't', '{}', '{\"fairness_key\": 7}')", Q)


async def test_a_key_left_out_of_the_walk_is_taken_back_when_its_job_returns(
    pool: asyncpg.Pool, store: JobStore
) -> None:
    await _submit(store, "a", 1)
    await _submit(store, "b", 3)
    first = await _claim(store, max_jobs=2)
    assert sorted(_keys(first)) == ["a", "b"]
    # a has no job waiting now: a claim passes over it and takes it out of the walk
    await _claim(store)
    assert await pool.fetchval("SELECT backlogged FROM evora.fair_keys WHERE key = 'a'") is False
    # its job fails and is retried at once: PENDING again, with a ledger row that brings a
    # back into the walk at the next claim
    [a] = [j for j in first if j["fairness_key"] == "a"]
    await store.fail(Failure(a["id"], a["lease_token"], "again", retry_in_seconds=0))
    assert _keys(await _claim(store, max_jobs=2)).count("a") == 1


# Fairness keys and limits in one queue (docs/flow-control.md, "Fairness and limits"): the
# limited claim takes its candidates in the fair order and enforces the limits on them.

UPSTREAM = "api:upstream"


async def _submit_limited(store: JobStore, key: str, count: int, *limit_keys: str) -> None:
    await store.submit_batch(
        [
            JobSubmission(queue=Q, type="t", fairness_key=key, limit_keys=list(limit_keys))
            for _ in range(count)
        ]
    )


async def _running_holders(pool: asyncpg.Pool, limit_key: str) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM evora.jobs WHERE state = 'RUNNING' AND $1 = ANY(limit_keys)",
            limit_key,
        )
    )


async def test_weights_hold_in_a_queue_whose_jobs_carry_a_concurrency_limit(
    pool: asyncpg.Pool, store: JobStore, clock: Clock
) -> None:
    await FairnessStore(pool).put("heavy", 9)
    await LimitStore(pool).put(UPSTREAM, LimitSpec(concurrency=5, rate=None))
    # light's jobs first: in claim order (the limited claim's one lane, api:upstream) light
    # would be served alone until its jobs ran out
    await _submit_limited(store, "light", 100, UPSTREAM)
    await _submit_limited(store, "heavy", 100, UPSTREAM)
    served: Counter[str] = Counter()
    holders: list[int] = []

    async def claimer() -> list[dict[str, Any]]:
        jobs = await _claim(store, max_jobs=2)
        holders.append(await _running_holders(pool, UPSTREAM))
        return jobs

    # 20 turns, each of 8 claimers at once until the limit's room is taken (a claimer that
    # finds the key's bucket held by another skips it); each job holds its lease 1 s (the
    # clock moves between the claims and the completions), so the weights share dispatches 1:9
    for _ in range(20):
        claimed: list[dict[str, Any]] = []
        for _attempt in range(20):
            for jobs in await asyncio.gather(*(claimer() for _ in range(8))):
                claimed += jobs
            if len(claimed) >= 5:
                break
        assert len(claimed) == 5
        served.update(_keys(claimed))
        await clock.advance(1, partitions=False)
        for job in claimed:
            await store.complete(job["id"], job["lease_token"])
    assert max(holders) <= 5, holders
    # ideal 10 : 90, within the tolerance of the unlimited fair claim's test above
    assert abs(served["light"] - 10) <= 4 and abs(served["heavy"] - 90) <= 4, served
    # the fair claim's ledger counted every job it served, and nothing else
    charged = dict(await pool.fetch("SELECT key, served FROM evora.fair_keys WHERE queue = $1", Q))
    assert charged == dict(served), charged


async def test_a_key_without_room_gives_its_turn_to_the_next_fair_choice(
    pool: asyncpg.Pool, store: JobStore
) -> None:
    await LimitStore(pool).put("cap:a", LimitSpec(concurrency=1, rate=None))
    await _submit_limited(store, "a", 10, "cap:a")
    await _submit_limited(store, "b", 10)
    await _submit_limited(store, "c", 10)
    # fair order a, b, c, a, b, c: a has room for one; the turns its limit refuses go to the
    # next fair choices, b and c alike (in claim order, b's jobs, submitted first, would
    # take them all)
    first = Counter(_keys(await _claim(store, max_jobs=6)))
    assert first["a"] == 1 and first["b"] + first["c"] == 5, first
    assert abs(first["b"] - first["c"]) <= 1, first
    # a was charged for the one job it got, not for the turns it was refused: with its job
    # done, it is first in line again
    assert await pool.fetchval("SELECT served FROM evora.fair_keys WHERE key = 'a'") == 1
    [a] = await pool.fetch(
        "SELECT id, lease_token FROM evora.jobs WHERE state = 'RUNNING' AND fairness_key = 'a'"
    )
    await store.complete(a["id"], a["lease_token"])
    assert _keys(await _claim(store)) == ["a"]


async def test_fair_claims_under_a_limit_wait_for_the_queues_turn_without_deadlock(
    db_url: str, pool: asyncpg.Pool, store: JobStore
) -> None:
    await LimitStore(pool).put(UPSTREAM, LimitSpec(concurrency=4, rate=None))
    await _submit_limited(store, "a", 20, UPSTREAM)
    await _submit_limited(store, "b", 20, UPSTREAM)
    # a queue without fairness keys whose jobs hold the same limited key
    await store.submit_batch(
        [JobSubmission(queue="plain", type="t", limit_keys=[UPSTREAM]) for _ in range(5)]
    )
    early = await asyncpg.connect(db_url)
    try:
        held = early.transaction()
        await held.start()
        # left open holding the fair queue's turn and api:upstream's bucket
        first = await early.fetch(queries.CLAIM, [Q], None, 1, "early")
        assert [r["job"]["fairness_key"] for r in first] == ["a"]
        # at the unlucky moment: fair claimers on several connections wait for the turn, one
        # of them naming the plain queue too; the plain queue's claims find the bucket held
        # and skip it, never waiting
        fair = [
            asyncio.create_task(store.claim(worker_id=f"w{n}", queues=queues, max_jobs=1))
            for n, queues in enumerate([[Q], [Q], [Q], ["plain", Q]])
        ]
        plain = await asyncio.wait_for(
            asyncio.gather(*(store.claim(worker_id="p", queues=["plain"]) for _ in range(2))), 10
        )
        assert plain == [[], []]
        await waits_for_a_lock(pool)
        assert not any(t.done() for t in fair)
        await held.commit()
        claimed = [j for jobs in await asyncio.wait_for(asyncio.gather(*fair), 10) for j in jobs]
    finally:
        await early.close()
    # the limit's room (4, 1 taken by the held claim) went to the fair choices after the
    # held claim's: b, a, b, in whatever order the waiters got the turn
    assert await _running_holders(pool, UPSTREAM) == 4
    assert sorted(_keys(claimed)) == ["a", "b", "b"], claimed


async def test_racing_fair_claimers_under_a_limit_never_exceed_it(
    pool: asyncpg.Pool, store: JobStore
) -> None:
    await FairnessStore(pool).put("b", 3)
    await LimitStore(pool).put(UPSTREAM, LimitSpec(concurrency=3, rate=None))
    await LimitStore(pool).put("cap:*", LimitSpec(concurrency=1, rate=None))
    await _submit_limited(store, "a", 40, UPSTREAM)
    await _submit_limited(store, "b", 40, UPSTREAM, "cap:b")
    await store.submit_batch([JobSubmission(queue=Q, type="t") for _ in range(20)])
    holders: list[int] = []
    done: list[dict[str, Any]] = []

    # 8 workers claiming and completing at once, plain autocommit statements
    async def worker() -> None:
        while len(done) < 100:
            jobs = await _claim(store, max_jobs=3)
            holders.append(await _running_holders(pool, UPSTREAM))
            for job in jobs:
                await store.complete(job["id"], job["lease_token"])
                done.append(job)
            if not jobs:
                await asyncio.sleep(0.001)

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(8))), 60)
    assert max(holders) <= 3, holders
    assert len({j["id"] for j in done}) == len(done) == 100
    assert await _running_holders(pool, UPSTREAM) == 0
    # every keyed job charged once, by the claim that moved it
    assert [
        tuple(r)
        for r in await pool.fetch(
            "SELECT key, served FROM evora.fair_keys WHERE queue = $1 ORDER BY key", Q
        )
    ] == [("a", 40), ("b", 40)]
