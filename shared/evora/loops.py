"""The event loop Evora's processes run on.

uvloop where it is installed (a default dependency on Linux and macOS): its transports are
C, which makes every HTTP request and database round trip cheaper, measurably so for the
services' throughput (docs/benchmarks.md). Plain asyncio otherwise; behaviour is the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """Like `asyncio.run`, on the loop above."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
