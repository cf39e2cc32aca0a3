"""One active replica: a session-level advisory lock held on a dedicated connection.

The lock lives exactly as long as the session that took it, so it is held on a connection
of its own, never one from the pool (a pooled session would carry the lock back into the
pool and out to unrelated work). When that connection dies, PostgreSQL frees the lock and a
standby, retrying every few seconds, takes over; this replica stops leading at once and
leads again only after it reconnects and re-acquires the lock.

The lock saves work, it does not make anything correct: every statement the leader runs is
fenced and uses SKIP LOCKED, so two leaders at once (one that has not yet noticed its
connection died, say) only share the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Coroutine
from typing import Any

import asyncpg

from evora.storage.db import Pooler, connect
from evora.waiting import Backoff, wait_until_set

log = logging.getLogger(__name__)

# Runs while this replica leads; must return soon after the event it is given is set.
Lead = Callable[[asyncio.Event], Coroutine[Any, Any, None]]

STANDBY_SECONDS = 3.0
# A lost connection usually shows at once (the socket closes); the ping finds the half-open
# ones (a network partition) within this long.
PING_SECONDS = 2.0
PING_TIMEOUT = 2.0
CLOSE_TIMEOUT = 2.0

CONNECTION_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


class AdvisoryLeader:
    def __init__(
        self,
        dsn: str,
        key: int,
        *,
        name: str,
        standby_seconds: float = STANDBY_SECONDS,
        on_change: Callable[[bool], None] | None = None,
        pooler: Pooler = "none",
    ) -> None:
        self._dsn = dsn
        self._pooler = pooler
        self._key = key
        self._name = name
        self._standby_seconds = standby_seconds
        self._on_change = on_change or (lambda active: None)

    async def run(self, lead: Lead, stop: asyncio.Event) -> None:
        """Until `stop` is set: connect, wait for the lock, lead while holding it, and start
        over whenever the connection is lost."""
        backoff = Backoff()
        while not stop.is_set():
            try:
                conn = await connect(self._dsn, application_name=self._name, pooler=self._pooler)
            except Exception as exc:  # whatever fails, this loop must go on (with backoff)
                delay = backoff.next()
                log.warning("%s: cannot connect (%r); retrying in %.1fs", self._name, exc, delay)
                await wait_until_set(stop, delay)
                continue
            backoff.reset()
            led = False
            try:
                if await self._acquire(conn, stop):
                    led = True
                    await self._lead(conn, lead, stop)
            except CONNECTION_ERRORS as exc:
                log.warning("%s: lock connection lost (%r); reconnecting", self._name, exc)
            except Exception:
                # A bug in `lead` must not end leadership for good: step down, retry later.
                log.exception("%s: leading failed; stepping down", self._name)
            finally:
                await self._release(conn)
            if led:
                # This replica's connection just failed and the standbys' did not: give them
                # the first chance (they retry within 1.5 standby periods) before trying again.
                await wait_until_set(stop, 2 * self._standby_seconds)

    async def _acquire(self, conn: asyncpg.Connection, stop: asyncio.Event) -> bool:
        announced = False
        while not stop.is_set():
            if await conn.fetchval(
                "SELECT pg_try_advisory_lock($1)", self._key, timeout=PING_TIMEOUT
            ):
                return True
            if not announced:
                log.info("%s: another replica is active; standing by", self._name)
                announced = True
            # The next attempt also proves the connection is still alive.
            await wait_until_set(stop, self._standby_seconds * (0.5 + random.random()))
        return False

    async def _lead(self, conn: asyncpg.Connection, lead: Lead, stop: asyncio.Event) -> None:
        ended = asyncio.Event()
        conn.add_termination_listener(lambda _conn: ended.set())
        log.info("%s: acquired the lock; active", self._name)
        self._on_change(True)
        leading = asyncio.create_task(lead(ended))
        watching = asyncio.create_task(self._watch(conn, ended))
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({leading, watching, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.set()
            for task in (watching, stopping):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            try:
                await leading  # it finishes its current batch, then returns
            finally:
                self._on_change(False)
                log.info("%s: no longer active", self._name)

    async def _watch(self, conn: asyncpg.Connection, ended: asyncio.Event) -> None:
        """Return when the lock connection is gone (the termination listener sets `ended`
        when the socket closes; the ping catches a connection that died silently)."""
        while not await wait_until_set(ended, PING_SECONDS):
            try:
                await conn.fetchval("SELECT 1", timeout=PING_TIMEOUT)
            except Exception as exc:  # of any kind: the connection cannot be trusted
                log.warning("%s: lock connection failed its ping (%r)", self._name, exc)
                return

    async def _release(self, conn: asyncpg.Connection) -> None:
        """Unlock, so a standby need not wait for the session to end, and disconnect.
        `unlock_all` rather than `unlock(key)`: it is also right when the lock was never
        taken, without a warning in the server log."""
        if conn.is_closed():
            return
        try:
            await conn.execute("SELECT pg_advisory_unlock_all()", timeout=CLOSE_TIMEOUT)
            await conn.close(timeout=CLOSE_TIMEOUT)
        except asyncio.CancelledError:
            conn.terminate()
            raise
        except Exception:  # closing is best effort; the session ends with the socket anyway
            conn.terminate()
