"""Coalescing concurrent single requests (submissions, acks) into set-based statements.

Items wait only while the previous flush is in flight: at low load every item goes out at
once, under load they ride together, so commits per job fall without adding latency.

The items of a flush are independent requests that share a statement, never a fate: each is
answered its own outcome, and none waits on a lock that another one ran into. A flush that
would wait for a lock held by a transaction outside (an application's open transaction
holding a key or a row) gives up at once; the batch is split until the item that needs the
lock is alone, and that item alone waits for it, out of line, so neither the items beside
it nor the requests that arrive behind it wait with it.
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
        contended: Callable[[Exception], bool] = lambda exc: False,
        patient: Callable[[Sequence[T]], Awaitable[Sequence[R]]] | None = None,
    ) -> None:
        """`flush` handles a batch in one atomic step and answers each item in order.
        `isolate(exc)` says whether a failed flush may have been caused by one item's values
        rather than by the flush as a whole (say, the database being down): then the batch is
        split until the failing items are alone, so a request is only ever answered with its
        own error. Re-running parts is safe because a failed atomic flush changed nothing.

        With `patient`, `flush` must not wait for locks (beyond a brief moment) and
        `contended(exc)` says whether it failed because it would have: the batch is split
        until the item that needs the lock is alone, and that item is flushed by `patient`,
        which waits for its lock as long as the item's own deadline allows, in a task of its
        own, while the coalescer goes on with the items beside and behind it."""
        self._flush = flush
        self._isolate = isolate
        self._contended = contended
        self._patient = patient
        self._waiting: set[asyncio.Task[None]] = set()
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
            if self._patient is not None and self._contended(exc):
                if len(batch) > 1:
                    log.info("a batch of %d waited for a lock; splitting it", len(batch))
                    await self._split(batch)
                    return
                waiting = asyncio.create_task(self._wait_alone(self._patient, batch))
                self._waiting.add(waiting)
                waiting.add_done_callback(self._waiting.discard)
                return
            if len(batch) > 1 and self._isolate(exc):
                log.info("a batch of %d failed (%r); splitting it to answer each", len(batch), exc)
                await self._split(batch)
                return
            self._fail(batch, exc)
            return
        self._answer(batch, results)

    async def _split(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        middle = len(batch) // 2
        await self._settle(batch[:middle])
        await self._settle(batch[middle:])

    async def _wait_alone(
        self,
        patient: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
        batch: list[tuple[T, asyncio.Future[R]]],
    ) -> None:
        try:
            results = await patient([item for item, _ in batch])
        except Exception as exc:
            self._fail(batch, exc)
            return
        self._answer(batch, results)

    @staticmethod
    def _fail(batch: list[tuple[T, asyncio.Future[R]]], exc: Exception) -> None:
        for _, future in batch:
            if not future.done():
                future.set_exception(exc)

    @staticmethod
    def _answer(batch: list[tuple[T, asyncio.Future[R]]], results: Sequence[R]) -> None:
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def close(self) -> None:
        if self._draining is not None:
            await self._draining
        if self._waiting:
            await asyncio.gather(*self._waiting)
