"""How much memory the request bodies of one service process may take at once.

Every endpoint bounds its own body (evora.http.bodies), but that bounds one request: a
hundred clients each sending a batch at the limit would make a process hold a hundred such
bodies and their parsed objects at once. `BodyBudgets` bound the sum, in two parts of half
the capacity (EVORA_BODY_BUDGET_BYTES) each:

- `bodies`: the bytes of bodies being read or held. A request with a declared length
  reserves it before reading a byte; a chunked one reserves each piece as it arrives.
- `parsing`: what parsing a body will cost, estimated once it has arrived from its size and
  its count of JSON values (a value becomes a Python object of up to ~80 bytes, so a body of
  nested empty lists costs far more than its bytes).

Bytes stay reserved until the request has been answered (the middleware of evora.http.app
gives them back), since the body and what was parsed from it live as long as its handler.
A request that finds no room waits in line, first come first served, for at most
BODY_BUDGET_WAIT_S, then is answered 503 with Retry-After: a busy process sheds load
instead of growing. Two parts, not one: a request waiting for parsing room already holds its
body's bytes, and if both came from one pool, requests holding bodies could fill it and
wait for each other; parsing room is only ever held by requests that wait for nothing more
from the budget, so a request in that line always gets in as they finish.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from aiohttp import web

# How long a request may wait for room before it is answered 503.
BODY_BUDGET_WAIT_S = 5.0


class ByteBudget:
    """A number of bytes handed out first come, first served."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a byte budget needs at least one byte")
        self.capacity = capacity
        self._held = 0
        self._line: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def held(self) -> int:
        """Bytes reserved now."""
        return self._held

    @property
    def waiting(self) -> int:
        """Requests waiting in line for room."""
        return len(self._line)

    async def reserve(self, size: int, deadline: float) -> None:
        """Hold `size` more bytes, waiting behind earlier requests until they fit; raises
        TimeoutError when `deadline` (the event loop's clock) passes first."""
        if size > self.capacity:
            raise ValueError(f"{size} bytes can never fit a budget of {self.capacity}")
        if not self._line and self._held + size <= self.capacity:
            self._held += size
            return
        admitted = asyncio.get_running_loop().create_future()
        entry = (size, admitted)
        self._line.append(entry)
        try:
            async with asyncio.timeout_at(deadline):
                await admitted
        except BaseException:
            if admitted.done() and not admitted.cancelled():
                self.release(size)  # admitted in the same moment: give it back
            else:
                admitted.cancel()
                if entry in self._line:
                    self._line.remove(entry)
                self._admit()  # a large request leaving the head may let smaller ones in
            raise

    def release(self, size: int) -> None:
        self._held -= size
        self._admit()

    def _admit(self) -> None:
        while self._line:
            size, admitted = self._line[0]
            if not admitted.done():  # else its request gave up and is leaving the line
                if self._held + size > self.capacity:
                    return
                self._held += size
                admitted.set_result(None)
            self._line.popleft()


@dataclass(frozen=True)
class BodyBudgets:
    bodies: ByteBudget
    parsing: ByteBudget

    @classmethod
    def of(cls, capacity: int) -> BodyBudgets:
        return cls(ByteBudget(capacity // 2), ByteBudget(capacity - capacity // 2))


BODY_BUDGETS = web.AppKey("body_budgets", BodyBudgets)
# What a request reserved, given back when it has been answered.
BODY_RESERVED = web.RequestKey("body_reserved", list[tuple[ByteBudget, int]])
