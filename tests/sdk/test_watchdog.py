"""The blocked-loop watchdog on its own, on a loop of the test's (no worker needed)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import pytest

from evora.sdk.watchdog import LoopWatchdog
from tests.polling import until


def describe(task: asyncio.Task[Any] | None) -> str:
    return "no task" if task is None else f"task {task.get_name()}"


async def test_a_blocking_task_is_named_while_it_blocks_and_its_block_measured_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watchdog = LoopWatchdog(0.2, describe)
    caplog.set_level(logging.WARNING, logger="evora.worker")
    watchdog.start()
    try:
        await asyncio.sleep(0.5)  # a healthy loop: nothing to say
        assert caplog.messages == []

        async def blocker() -> None:
            time.sleep(1.0)  # noqa: ASYNC251 - the very mistake watched for

        await asyncio.create_task(blocker(), name="the-blocker")
        await until(lambda: len(caplog.messages) >= 2, "the report after the block", within=10)
    finally:
        watchdog.stop()
    during, after = caplog.messages
    assert during.startswith("the event loop has been blocked for")
    assert "by task the-blocker (at " in during and "in blocker)" in during
    assert "asyncio.to_thread" in during
    match = re.search(r"ran again after being blocked for ([0-9.]+)s by task the-blocker", after)
    assert match is not None, after
    assert float(match.group(1)) >= 1.0
