"""The LISTEN task must outlive anything: its backend killed again and again (also while it
is still connecting), its connection cut or answered with garbage at every step of setting
it up, and callbacks that raise. It keeps delivering notifications after."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import get_args

import asyncpg
import pytest

from evora.storage.listener import Listener
from evora.storage.notify import JOBS_CHANNEL
from tests.pgproxy import Fault, FaultyProxy
from tests.polling import until

NAME = "evora-test-listen"
ROUNDS = 4
KILLS_WHILE_CONNECTING = 2  # in a row, so the backoff grows but stays short


class Killer:
    """Terminates the listener's backends, each new one once."""

    def __init__(self, pool: asyncpg.Pool, task: asyncio.Task[None]) -> None:
        self._pool = pool
        self._task = task
        self.killed: set[int] = set()

    def _check_alive(self) -> None:
        if self._task.done():
            raise AssertionError(f"the LISTEN task ended: {self._task!r}")

    async def kill_next(self, limit: float = 30.0) -> None:
        """Kill the next backend of the listener as soon as it shows up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while loop.time() < deadline:
            self._check_alive()
            pids = await self._pool.fetch(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1", NAME
            )
            for (pid,) in pids:
                if pid not in self.killed:
                    self.killed.add(pid)
                    await self._pool.execute("SELECT pg_terminate_backend($1)", pid)
                    return
            await asyncio.sleep(0.002)
        raise TimeoutError("the listener did not connect again")


@contextlib.asynccontextmanager
async def running(listener: Listener) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(listener.run())
    try:
        yield task
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def heard_after(pool: asyncpg.Pool, heard: list[str], payload: str) -> None:
    """A notification sent now is delivered (resent until the listener is back)."""

    async def sent() -> None:
        while payload not in heard:
            await pool.execute("SELECT pg_notify($1, $2)", JOBS_CHANNEL, payload)
            await asyncio.sleep(0.05)

    await asyncio.wait_for(sent(), 30)


async def test_listener_survives_its_backend_killed_over_and_over(
    db_url: str, pool: asyncpg.Pool
) -> None:
    heard: list[str] = []
    states: list[bool] = []
    listener = Listener(
        db_url, on_notify=heard.append, on_reconnect=lambda: None, on_state=states.append, name=NAME
    )
    async with running(listener) as task:
        killer = Killer(pool, task)
        for _ in range(ROUNDS):
            await asyncio.wait_for(listener.connected.wait(), 30)
            await killer.kill_next()  # while listening
            for _ in range(KILLS_WHILE_CONNECTING):
                await killer.kill_next()  # while it reconnects
        assert not task.done(), task
        await heard_after(pool, heard, "after-the-storm")
        assert len(killer.killed) == ROUNDS * (1 + KILLS_WHILE_CONNECTING)
        assert listener.connected.is_set() and states[-1] is True


async def test_listener_survives_callbacks_that_raise(db_url: str, pool: asyncpg.Pool) -> None:
    heard: list[str] = []
    reconnects: list[None] = []

    def on_notify(payload: str) -> None:
        if payload == "boom":
            raise RuntimeError("a bug in the owner")
        heard.append(payload)

    def on_reconnect() -> None:
        reconnects.append(None)
        raise RuntimeError("a bug in the catch-up")

    def on_state(_: bool) -> None:
        raise RuntimeError("a bug in the state observer")

    listener = Listener(db_url, on_notify, on_reconnect, on_state, name=NAME)
    async with running(listener) as task:
        killer = Killer(pool, task)
        await asyncio.wait_for(listener.connected.wait(), 30)
        await pool.execute("SELECT pg_notify($1, 'boom')", JOBS_CHANNEL)
        await heard_after(pool, heard, "still-listening")
        await killer.kill_next()
        await until(lambda: len(reconnects) == 1, within=30)
        await heard_after(pool, heard, "after-the-reconnect")
        assert not task.done(), task


async def test_listener_survives_its_connection_spoilt_at_every_step_of_setting_up(
    db_url: str, pool: asyncpg.Pool
) -> None:
    proxy = FaultyProxy(db_url)
    via_proxy = await proxy.start()
    heard: list[str] = []
    states: list[bool] = []
    listener = Listener(via_proxy, heard.append, lambda: None, states.append, name=NAME)
    try:
        async with running(listener) as task:
            killer = Killer(pool, task)
            await asyncio.wait_for(listener.connected.wait(), 30)
            await heard_after(pool, heard, "listening")
            steps = proxy.chunks[0]  # what a connection sends until it listens
            assert steps >= 3
            faults = [(fault, step) for fault in get_args(Fault) for step in range(1, steps + 1)]
            for done, fault in enumerate(faults, start=1):
                proxy.fault_next = fault
                await killer.kill_next()  # so that it connects again, through the fault
                await until(lambda: proxy.faults == done, within=30)  # noqa: B023
                # ...and once more, cleanly
                await until(lambda: states.count(True) == done + 1, within=30)  # noqa: B023
            await heard_after(pool, heard, "after-the-faults")
            assert not task.done(), task
    finally:
        proxy.close()
