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
    def __init__(self, flush: Callable[[Sequence[T]], Awaitable[Sequence[R]]]) -> None:
        self._flush = flush
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
                try:
                    results = await self._flush([item for item, _ in batch])
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._draining = None

    async def close(self) -> None:
        if self._draining is not None:
            await self._draining
