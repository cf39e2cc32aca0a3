"""Whether the projector reads PostgreSQL's history with its batches (HistoryChanged), on a
server that may refuse to tell it.

PostgreSQL as it ships lets any role read the history, but managed services and forks may
refuse it for good (outbox.HISTORY_REFUSALS: a revoked privilege, a function missing or not
supported). Failing every batch would stop the read models for good over a safeguard, so
the outbox is read on without it: failover detection is off, said once in a WARNING and by
`evora_projector_history_check_off`, and the read models are rebuilt after a failover only
when the operator runs `evora projector --rebuild`. The refused read is tried again only
every `retry_seconds` (a grant given back, the server upgraded or replaced), not with every
batch: each try costs an error in the server's log and a second statement.

A standby refuses the history too, for as long as it is one, and its outbox must not be read
without it (sql/outbox.sql, in_recovery): there the refusal is raised, as any other error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import asyncpg

from evora.storage.outbox import HISTORY_REFUSALS, Batch, in_recovery
from evora_services.projector.metrics import ProjectorMetrics

log = logging.getLogger(__name__)

RETRY_SECONDS = 600.0

# One read of a batch, on a pool or a connection, with the history or without it.
Read = Callable[[asyncpg.Pool | asyncpg.Connection, bool], Awaitable[Batch | None]]


class HistoryCheck:
    """The outcome of reading the history, for one process (its pool: one server, one role),
    shared by the projectors it runs one after another (the service's, a rebuild's)."""

    def __init__(
        self, metrics: ProjectorMetrics | None = None, retry_seconds: float = RETRY_SECONDS
    ) -> None:
        self._metrics = metrics
        self._retry_seconds = retry_seconds
        self.refused: str | None = None  # why the server refuses it; None: it tells
        self._retry_at = 0.0

    async def read(self, pool: asyncpg.Pool, read: Read) -> Batch | None:
        """`read` with the history while the server tells it (or a try is due), without it
        while it refuses."""
        if self.refused is not None and time.monotonic() < self._retry_at:
            return await read(pool, False)
        try:
            batch = await read(pool, True)
        except HISTORY_REFUSALS as refusal:
            # on one connection: the server asked whether it is a standby is the one read
            async with pool.acquire() as conn:
                if await in_recovery(conn):
                    raise
                # fails on its own if it was not the history that was refused (the role may
                # not read evora.job_events, the schema is older than this projector)
                batch = await read(conn, False)
            self._off(refusal)
            return batch
        self._on()
        return batch

    def _off(self, refusal: asyncpg.PostgresError) -> None:
        reason = f"{refusal} (SQLSTATE {refusal.sqlstate})"
        if self.refused is None:
            log.warning(
                "PostgreSQL refuses the projector its history (system identifier, timeline): "
                "%s. The outbox is read on without it, so a failover, switchover or restore "
                "goes unnoticed and the read models are not rebuilt by themselves: run "
                "`evora projector --rebuild` after one. Tried again every %.0f s.",
                reason,
                self._retry_seconds,
            )
        self.refused = reason
        self._retry_at = time.monotonic() + self._retry_seconds
        if self._metrics is not None:
            self._metrics.history_check_off.set(1)

    def _on(self) -> None:
        if self.refused is not None:
            log.info("PostgreSQL tells the projector its history again: failover detection on")
        self.refused = None
        if self._metrics is not None:
            self._metrics.history_check_off.set(0)
