"""Coalescing concurrent single requests (submissions, acks) into set-based statements.

Items wait only while the previous flush is in flight: at low load every item goes out at
once, under load they ride together, so commits per job fall without adding latency.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

MAX_BATCH = 500


class Coalescer(Generic[T, R]):
    def __init__(
        self,
        flush: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
        *,
        isolate: Callable[[Exception], bool] = lambda exc: False,
    ) -> None:
        """`flush` handles a batch in one atomic step and answers each item in order.
        `isolate(exc)` says whether a failed flush may have been caused by one item's values
        rather than by the flush as a whole (say, the database being down): then the batch is
        split until the failing items are alone, so a request is only ever answered with its
        own error. Re-running parts is safe because a failed atomic flush changed nothing."""
        self._flush = flush
        self._isolate = isolate
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._draining: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._draining is None:
            self._draining = asyncio.create_task(self._drain())
        # A caller that goes away does not withdraw its item: it is still written (as it
        # would be had its statement already started), and a retry gets the idempotent answer.
        return await asyncio.shield(future)

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch = self._pending[:MAX_BATCH]
                del self._pending[:MAX_BATCH]
                await self._settle(batch)
        finally:
            self._draining = None

    async def _settle(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._flush([item for item, _ in batch])
        except Exception as exc:
            if len(batch) > 1 and self._isolate(exc):
                log.info("a batch of %d failed (%r); splitting it to answer each", len(batch), exc)
                middle = len(batch) // 2
                await self._settle(batch[:middle])
                await self._settle(batch[middle:])
                return
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def close(self) -> None:
        if self._draining is not None:
            await self._draining
