"""The budget of request bodies in one process (evora.http.budget): its byte lines, and how
large it is."""

from __future__ import annotations

import asyncio

import pytest

from evora.config import Settings
from evora.http.budget import ByteBudget
from evora.protocol.bounds import DEFAULT_BODY_BUDGET_BYTES, MIB
from tests.polling import until


def later(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


async def in_line(budget: ByteBudget, count: int) -> None:
    """Until `count` requests wait in the budget's line."""
    await until(lambda: budget.waiting == count, f"{count} requests in line", within=5)


async def test_requests_wait_in_line_and_are_admitted_in_order_as_bytes_come_back() -> None:
    budget = ByteBudget(100)
    await budget.reserve(60, later(1))
    admitted: list[str] = []

    async def request(name: str, size: int) -> None:
        await budget.reserve(size, later(5))
        admitted.append(name)

    big = asyncio.create_task(request("big", 70))
    await in_line(budget, 1)
    small = asyncio.create_task(request("small", 10))
    await in_line(budget, 2)
    # 10 bytes would fit, but the big request came first: no overtaking.
    assert admitted == [] and budget.waiting == 2 and budget.held == 60
    budget.release(60)
    await asyncio.gather(big, small)
    assert admitted == ["big", "small"] and budget.held == 80


async def test_a_request_that_waits_too_long_leaves_the_line_and_lets_the_next_in() -> None:
    budget = ByteBudget(100)
    await budget.reserve(50, later(1))
    too_big = asyncio.create_task(budget.reserve(60, later(0.05)))
    await in_line(budget, 1)
    behind = asyncio.create_task(budget.reserve(40, later(5)))
    with pytest.raises(TimeoutError):
        await too_big
    await asyncio.wait_for(behind, 1)  # 50 + 40 fit once the 60 gave up
    assert budget.held == 90 and budget.waiting == 0


async def test_a_request_cancelled_while_waiting_holds_nothing() -> None:
    budget = ByteBudget(10)
    await budget.reserve(10, later(1))
    waiting = asyncio.create_task(budget.reserve(5, later(5)))
    await in_line(budget, 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    budget.release(10)
    assert budget.held == 0 and budget.waiting == 0


async def test_admitted_in_the_same_moment_as_cancelled_gives_the_bytes_back() -> None:
    budget = ByteBudget(10)
    await budget.reserve(10, later(1))
    waiting = asyncio.create_task(budget.reserve(5, later(5)))
    await in_line(budget, 1)
    budget.release(10)  # admits the waiter: its future is done, its task not yet resumed
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert budget.held == 0


async def test_more_than_the_capacity_can_never_be_reserved() -> None:
    with pytest.raises(ValueError, match="never fit"):
        await ByteBudget(10).reserve(11, later(1))


def test_the_budget_holds_twice_the_largest_body_at_least() -> None:
    assert Settings().body_budget == DEFAULT_BODY_BUDGET_BYTES
    # 4 payloads of 32 MiB make the largest batch body 128 MiB
    assert Settings(max_payload_bytes=32 * MIB).body_budget == 256 * MIB
    assert Settings(body_budget_bytes=40 * MIB).body_budget == 40 * MIB
    with pytest.raises(ValueError, match="EVORA_BODY_BUDGET_BYTES"):
        Settings(body_budget_bytes=31 * MIB)  # the largest body is 16 MiB
