"""A process's one LISTEN connection for NOTIFY hints: dedicated, not from the pool,
checked with a ping, reconnected with backoff, and followed by a catch-up pass after every
reconnect because notifications sent while it was away are gone."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import NoReturn

import asyncpg

from evora.storage.db import Pooler, connect
from evora.storage.notify import JOBS_CHANNEL
from evora.waiting import Backoff

log = logging.getLogger(__name__)

PING_SECONDS = 5.0
PING_TIMEOUT = 3.0


class Listener:
    def __init__(
        self,
        dsn: str,
        on_notify: Callable[[str], None],
        on_reconnect: Callable[[], None],
        on_state: Callable[[bool], None] | None = None,
        name: str = "evora-listen",
        pooler: Pooler = "none",
    ) -> None:
        self._dsn = dsn
        self._pooler = pooler
        self._name = name
        self._on_notify = on_notify
        self._on_reconnect = on_reconnect
        self._on_state = on_state or (lambda connected: None)
        self.connected = asyncio.Event()
        # after the first connection, every new one starts with a catch-up pass
        self._listened = False

    def _deliver(
        self,
        conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy,
        pid: int,
        channel: str,
        payload: object,
    ) -> None:
        if isinstance(payload, str) and payload:
            _guarded(self._on_notify, payload)

    async def run(self) -> None:
        """Listen until cancelled, reconnecting forever. Whatever goes wrong while
        connecting or listening (the server, the network, asyncpg's own state, a bug) is
        logged and retried with backoff: this task must never end while the process runs,
        since the process would go on without hints and nobody would notice."""
        backoff = Backoff()
        while True:
            try:
                await self._listen(backoff)
            except Exception as exc:  # every failure is "the connection is gone"
                delay = backoff.next()
                log.warning(
                    "LISTEN connection lost or failed (%s: %s); reconnecting in %.1fs",
                    type(exc).__name__,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)

    async def _listen(self, backoff: Backoff) -> NoReturn:
        """One connection, from connect to its loss."""
        conn = await connect(self._dsn, application_name=self._name, pooler=self._pooler)
        try:
            await conn.add_listener(JOBS_CHANNEL, self._deliver)
            self.connected.set()
            backoff.reset()
            _guarded(self._on_state, True)
            if self._listened:
                log.info("LISTEN connection restored; catching up")
                _guarded(self._on_reconnect)
            self._listened = True
            await self._watch(conn)
        finally:
            if self.connected.is_set():
                self.connected.clear()
                _guarded(self._on_state, False)
            conn.terminate()

    async def _watch(self, conn: asyncpg.Connection) -> NoReturn:
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _: lost.set())
        while not lost.is_set():
            try:
                await asyncio.wait_for(lost.wait(), PING_SECONDS)
            except TimeoutError:
                await conn.fetchval("SELECT 1", timeout=PING_TIMEOUT)
        raise ConnectionResetError("the server closed the LISTEN connection")


def _guarded(callback: Callable[..., None], *args: object) -> None:
    """Run a callback of the owner; its failure is a bug to log, not a reason to drop the
    connection or lose the next notifications."""
    try:
        callback(*args)
    except Exception:
        log.exception("a LISTEN callback failed")
