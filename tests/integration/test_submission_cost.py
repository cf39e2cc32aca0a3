"""What storing a batch of submissions costs PostgreSQL grows with the batch, not with its
square, in the plan PL/pgSQL keeps for evora.store_submissions() after a few calls (a
generic one, made without knowing how many items the arrays hold) as in the plans made for
the first calls.

The work is counted, not timed: auto_explain reports every nested statement's plan with the
rows each node produced and the rows its filters threw away, and their sum per item must not
grow with the batch. (A nested loop joining the items to themselves reads n rows n times.)
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.storage.db import connect
from evora.storage.jobs import JobStore
from evora.storage.submissions import Submitted

SMALL, LARGE = 100, 400
# Rows produced or filtered per item by all the statements of one call. The submit path
# counts 18-46 per item (shapes below); a join of the items to themselves adds the batch
# size per item.
WORK_PER_ITEM_BOUND = 120

Shape = Callable[[int, int], list[JobSubmission]]


def plain(start: int, count: int) -> list[JobSubmission]:
    return [
        JobSubmission(queue="q", type="t", payload={"n": i}) for i in range(start, start + count)
    ]


def keyed(start: int, count: int) -> list[JobSubmission]:
    """Every item keyed, the last one repeating the first one's key."""
    items = [
        JobSubmission(queue="q", type="t", payload={"n": i}, idempotency_key=f"k{i}")
        for i in range(start, start + count - 1)
    ]
    return [*items, items[0]]


def limited(start: int, count: int) -> list[JobSubmission]:
    return [
        JobSubmission(queue="q", type="t", payload={"n": i}, limit_keys=[f"a{i % 7}", "b"])
        for i in range(start, start + count)
    ]


def chained(start: int, count: int) -> list[JobSubmission]:
    """Each item after the first waits for the one before it."""
    return [
        JobSubmission(
            queue="q",
            type="t",
            payload={"n": i},
            ref=f"r{i}",
            depends_on=[] if i == start else [f"ref:r{i - 1}"],
        )
        for i in range(start, start + count)
    ]


def keyed_chained(start: int, count: int) -> list[JobSubmission]:
    """Chained, every item keyed: each key's fingerprint takes in the one before it."""
    return [
        sub.model_copy(update={"idempotency_key": f"c{sub.ref}"}) for sub in chained(start, count)
    ]


@pytest.fixture
async def explained(db_url: str) -> AsyncIterator[tuple[asyncpg.Connection, list[str]]]:
    """A connection whose every statement, nested ones included, sends its analysed plan
    to the client as a NOTICE."""
    conn = await connect(db_url)
    plans: list[str] = []
    try:
        # The embedded PostgreSQL ships auto_explain: not loading it is a failure, not a skip.
        await conn.execute("LOAD 'auto_explain'")
        for setting, value in (
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_analyze", "on"),
            ("auto_explain.log_timing", "off"),
            ("auto_explain.log_nested_statements", "on"),
            ("auto_explain.log_format", "json"),
            ("auto_explain.log_level", "notice"),
            ("client_min_messages", "notice"),
        ):
            await conn.execute(f"SET {setting} = '{value}'")
        conn.add_log_listener(lambda _conn, message: plans.append(message.message))
        yield conn, plans
    finally:
        await conn.close()


def node_work(node: dict[str, Any]) -> float:
    """Rows a plan node and the nodes under it produced or discarded, over all its loops."""
    loops = node.get("Actual Loops", 1)
    own = node.get("Actual Rows", 0) + sum(
        node.get(k, 0) for k in ("Rows Removed by Filter", "Rows Removed by Join Filter")
    )
    work: float = own * loops + sum(node_work(child) for child in node.get("Plans", []))
    return work


def plan_work(messages: list[str]) -> float:
    total = 0.0
    for message in messages:
        if "{" in message:
            total += node_work(json.loads(message[message.index("{") :])["Plan"])
    return total


async def work_per_item(
    store: JobStore,
    conn: asyncpg.Connection,
    plans: list[str],
    shape: Shape,
    start: int,
    count: int,
) -> float:
    submissions = shape(start, count)
    plans.clear()
    async with conn.transaction():
        outcomes = await store.submit_in(conn, submissions)
    assert all(isinstance(o, Submitted) for o in outcomes), outcomes
    return plan_work(plans) / count


@pytest.mark.parametrize("plan_cache_mode", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize(
    "shape", [plain, keyed, limited, chained, keyed_chained], ids=lambda s: s.__name__
)
async def test_the_work_per_item_does_not_grow_with_the_batch(
    store: JobStore,
    explained: tuple[asyncpg.Connection, list[str]],
    plan_cache_mode: str,
    shape: Shape,
) -> None:
    conn, plans = explained
    await conn.execute(f"SET plan_cache_mode = {plan_cache_mode}")
    await work_per_item(store, conn, plans, shape, -10, 3)  # the connection's first lookups
    small = await work_per_item(store, conn, plans, shape, 0, SMALL)
    large = await work_per_item(store, conn, plans, shape, SMALL, LARGE)
    print(f"{shape.__name__} {plan_cache_mode}: {small:.1f} / {large:.1f} rows per item")
    assert large < WORK_PER_ITEM_BOUND, (small, large)
    assert large < 1.5 * small + 5, (small, large)


async def test_a_retried_keyed_batch_is_answered_in_linear_work(
    store: JobStore, explained: tuple[asyncpg.Connection, list[str]]
) -> None:
    """Every item replays: they are answered by their keys, not created."""
    conn, plans = explained
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    first = await work_per_item(store, conn, plans, keyed, 0, LARGE)
    again = await work_per_item(store, conn, plans, keyed, 0, LARGE)
    print(f"keyed, created / replayed: {first:.1f} / {again:.1f} rows per item")
    assert again < WORK_PER_ITEM_BOUND, again


# The fields an item of a typical batch leaves out: all but queue, type and payload.
LEFT_OUT = frozenset(JobSubmission.model_fields) - {"queue", "type", "payload"}
reads: Counter[str] = Counter()


class CountedSubmission(JobSubmission):
    """A submission that counts the reads of the fields a typical item leaves out."""

    def __getattribute__(self, name: str) -> Any:
        if name in LEFT_OUT:
            reads[name] += 1
        return super().__getattribute__(name)


async def test_a_batch_of_defaults_reads_each_left_out_field_once_not_per_item(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """The api's Python work per item of a batch whose items set only queue, type and
    payload: every other column of the statement is the default, read once for the batch
    (reading 25 fields of each item and comparing them was about a tenth of the api's CPU per
    job, docs/benchmarks/2026-11-29-submit-cost.md). What the jobs store is the defaults."""
    items = [CountedSubmission(queue="q", type="t", payload={"n": i}) for i in range(LARGE)]
    reads.clear()
    async with pool.acquire() as conn, conn.transaction():
        outcomes = await store.submit_in(conn, items)
    assert all(isinstance(o, Submitted) and o.created for o in outcomes), outcomes
    assert max(reads.values()) <= 3, reads.most_common(3)
    stored = await pool.fetch(
        "SELECT DISTINCT priority, max_attempts, lease_seconds, backoff_initial, backoff_max,"
        " backoff_multiplier, expires_at, idempotency_key, group_key, state, depends_on,"
        " on_dependency_failure, limit_keys, max_duration_seconds, fairness_key,"
        " run_at = created_at AS now FROM evora.jobs"
    )
    assert [tuple(r) for r in stored] == [
        (
            0,
            5,
            30,
            # the default backoff and on_dependency_failure: NULL (migration 0067)
            None,
            None,
            None,
            None,
            None,
            None,
            "PENDING",
            None,
            None,
            [],
            None,
            None,
            True,
        )
    ]
