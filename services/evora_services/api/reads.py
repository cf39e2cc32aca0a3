"""Reads of jobs and their events from a read replica (EVORA_READ_DATABASE_URL), each one
only once the replica has replayed what its client has seen: its own writes, and whatever
an earlier read showed it (docs/scaling.md#read-replica).

The client's position travels in the `Evora-Read-After` header (evora.protocol.positions):
the api answers every write with the primary's position after it and every read with the
position of the server that answered, and the client sends back the highest it has seen. No
session sticks to a process: any api process may serve any request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import asyncpg
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from evora.coalesce import Coalescer
from evora.config import Settings
from evora.http.app import DATABASE_CONFLICT, DATABASE_UNAVAILABLE
from evora.http.problems import Problem
from evora.protocol import problems
from evora.protocol.positions import READ_AFTER_HEADER, format_position, parse_position
from evora.storage.jobs import JobStore
from evora.storage.replica import POLL_SECONDS, Replica, ReplicaPosition, primary_position

log = logging.getLogger(__name__)

T = TypeVar("T")

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Whatever goes wrong on the replica sends the read to the primary: a replica that is down,
# slow, cancels the read to replay (a recovery conflict) or is misconfigured never fails a
# request the primary can answer.
REPLICA_FAILURES = (*DATABASE_UNAVAILABLE, *DATABASE_CONFLICT, asyncpg.PostgresError)

READ_AFTER = web.RequestKey("read_after", int)


def read_after(request: web.Request) -> int:
    """The highest position the client sends (0 without the header); 400 when one is not a
    position."""
    highest = 0
    for value in request.headers.getall(READ_AFTER_HEADER, ()):
        for text in value.split(","):
            position = parse_position(text)
            if position is None:
                raise Problem(
                    400,
                    problems.INVALID_HEADER,
                    "Invalid header",
                    f"{READ_AFTER_HEADER} must be a position as the api answers it "
                    "(like 16/B374D848)",
                )
            highest = max(highest, position)
    return highest


class Reads:
    """Where a read goes: the replica when it has replayed the client's position (waiting
    for it up to EVORA_READ_REPLICA_MAX_WAIT_MS) and lags no more than
    EVORA_READ_REPLICA_MAX_LAG, else the primary."""

    def __init__(
        self,
        primary: JobStore,
        primary_pool: asyncpg.Pool,
        replica_pool: asyncpg.Pool | None,
        settings: Settings,
        registry: CollectorRegistry,
    ) -> None:
        self._primary = primary
        self._replica = None if replica_pool is None else Replica(replica_pool)
        # Only read methods of this store are called: the replica takes no writes.
        self._replica_store = None if replica_pool is None else JobStore(replica_pool)
        self._max_wait = settings.read_replica_max_wait_ms / 1000
        self._max_lag = settings.read_replica_max_lag

        async def ask(items: Sequence[None]) -> list[int]:
            return [await primary_position(primary_pool)] * len(items)

        # Concurrent writes share one question (each asked after their commits).
        self._positions = Coalescer(ask)
        self.served = Counter(
            "evora_read_replica_reads",
            "Reads the read replica answered.",
            registry=registry,
        )
        self.fallbacks = Counter(
            "evora_read_replica_fallbacks",
            "Reads that went to the primary although a read replica is configured, by why: "
            "unavailable (it failed or is not a standby), lag (further behind than "
            "EVORA_READ_REPLICA_MAX_LAG), behind (it did not replay the client's position "
            "within EVORA_READ_REPLICA_MAX_WAIT_MS).",
            ["reason"],
            registry=registry,
        )
        self.lag = Gauge(
            "evora_read_replica_lag_seconds",
            "How far behind the primary the read replica was when last asked.",
            registry=registry,
        )

    @property
    def replicated(self) -> bool:
        return self._replica is not None

    async def primary_position(self) -> int:
        """The primary's position, asked after this call began."""
        return await self._positions.submit(None)

    async def read(self, after: int, read: Callable[[JobStore], Awaitable[T]]) -> tuple[T, int]:
        """`read` on the replica when it may answer, else on the primary; with the position
        the answer is as new as (0 without a replica: positions mean nothing then)."""
        if self._replica is None or self._replica_store is None:
            return await read(self._primary), 0
        reason = await self._route(self._replica, after)
        if reason is None:
            try:
                result = await read(self._replica_store)
                # Asked after the read: the position covers everything the read saw.
                position = self._seen(await self._replica.position(max_age=0))
            except REPLICA_FAILURES as exc:
                reason = self._failed(self._replica, repr(exc))
            else:
                if position.replayed is not None:
                    self.served.inc()
                    return result, max(position.replayed, after)
                reason = self._failed(self._replica, "it is not a standby (promoted?)")
        self.fallbacks.labels(reason).inc()
        result = await read(self._primary)
        return result, max(await self.primary_position(), after)

    async def _route(self, replica: Replica, after: int) -> str | None:
        """None when the replica may answer a client at `after`, else why not."""
        if replica.down:
            return "unavailable"
        try:
            position = self._seen(await replica.position())
            if position.replayed is None:
                return self._failed(replica, "it is not a standby (promoted?)")
            if position.lag is None or position.lag > self._max_lag:
                return "lag"
            deadline = asyncio.get_running_loop().time() + self._max_wait
            while position.replayed < after:
                if asyncio.get_running_loop().time() + POLL_SECONDS > deadline:
                    return "behind"
                await asyncio.sleep(POLL_SECONDS)
                position = self._seen(await replica.position(max_age=0))
                if position.replayed is None:
                    return self._failed(replica, "it is not a standby (promoted?)")
        except REPLICA_FAILURES as exc:
            return self._failed(replica, repr(exc))
        return None

    def _seen(self, position: ReplicaPosition) -> ReplicaPosition:
        if position.lag is not None:
            self.lag.set(position.lag)
        return position

    @staticmethod
    def _failed(replica: Replica, why: str) -> str:
        """The replica is left alone for a moment; logged once per such moment."""
        if not replica.down:
            log.warning("the read replica cannot answer (%s): reads go to the primary", why)
        replica.failed()
        return "unavailable"


READS = web.AppKey("reads", Reads)


async def read_jobs(
    request: web.Request, read: Callable[[JobStore], Awaitable[T]]
) -> tuple[T, dict[str, str]]:
    """`read` where the client's position allows, and the header to answer with."""
    result, position = await request.app[READS].read(request[READ_AFTER], read)
    return result, {READ_AFTER_HEADER: format_position(position)} if position else {}


@web.middleware
async def answer_positions(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Reads the client's position from every request; answers every successful write, when
    a replica is configured, with the primary's position after it."""
    request[READ_AFTER] = read_after(request)
    response = await handler(request)
    reads = request.app[READS]
    if (
        request.method in READ_METHODS
        or response.status >= 400
        or response.prepared
        or not reads.replicated
    ):
        return response
    try:
        position = await reads.primary_position()
    except DATABASE_UNAVAILABLE as exc:
        # The write is done: failing its answer now would only make the client repeat it.
        log.warning("answering a write without %s: %r", READ_AFTER_HEADER, exc)
        return response
    response.headers[READ_AFTER_HEADER] = format_position(max(position, request[READ_AFTER]))
    return response
