"""A process's one LISTEN connection for NOTIFY hints (rule 7): dedicated, not from the pool,
checked with a ping, reconnected with backoff, and followed by a catch-up pass after every
reconnect because notifications sent while it was away are gone."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

import asyncpg

from evora.storage.db import connect
from evora.storage.notify import JOBS_CHANNEL

log = logging.getLogger(__name__)

PING_SECONDS = 5.0
PING_TIMEOUT = 3.0
BACKOFF_INITIAL = 0.2
BACKOFF_MAX = 10.0


class Listener:
    def __init__(
        self,
        dsn: str,
        on_notify: Callable[[str], None],
        on_reconnect: Callable[[], None],
        on_state: Callable[[bool], None] | None = None,
        name: str = "evora-listen",
    ) -> None:
        self._dsn = dsn
        self._name = name
        self._on_notify = on_notify
        self._on_reconnect = on_reconnect
        self._on_state = on_state or (lambda connected: None)
        self.connected = asyncio.Event()

    def _deliver(
        self,
        conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy,
        pid: int,
        channel: str,
        payload: object,
    ) -> None:
        if isinstance(payload, str) and payload:
            self._on_notify(payload)

    async def run(self) -> None:
        """Listen until cancelled, reconnecting forever."""
        delay = BACKOFF_INITIAL
        first = True
        while True:
            try:
                conn = await connect(self._dsn, application_name=self._name)
            except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
                log.warning("LISTEN connection failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, BACKOFF_MAX)
                continue
            delay = BACKOFF_INITIAL
            try:
                await conn.add_listener(JOBS_CHANNEL, self._deliver)
                self.connected.set()
                self._on_state(True)
                if not first:
                    log.info("LISTEN connection restored; catching up")
                    self._on_reconnect()
                first = False
                await self._watch(conn)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                log.warning("LISTEN connection lost (%s); reconnecting", exc)
            finally:
                self.connected.clear()
                self._on_state(False)
                conn.terminate()

    async def _watch(self, conn: asyncpg.Connection) -> None:
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _: lost.set())
        while not lost.is_set():
            try:
                await asyncio.wait_for(lost.wait(), PING_SECONDS)
            except TimeoutError:
                await conn.fetchval("SELECT 1", timeout=PING_TIMEOUT)
        raise ConnectionResetError("the server closed the LISTEN connection")
