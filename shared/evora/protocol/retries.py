"""How a client of the services spaces its retries: which answers are worth repeating and
how long to wait before each repeat. The SDK retries by these, and the services' own loops
(the sweeper, the projector, a lost LISTEN connection) back off with the same formula."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

# Gateway answers: the service may be restarting or overloaded; the same request may work
# a moment later.
RETRYABLE_STATUSES: Final = frozenset({502, 503, 504})


@dataclass(frozen=True)
class RetryBackoff:
    """Exponential backoff with jitter: retry n waits between half and all of
    `min(max_delay, initial * multiplier ** (n - 1))` seconds.

    Half the ceiling is guaranteed so that delays really grow while the server is down; the
    random other half spreads out many clients that failed at the same moment."""

    initial: float = 0.2
    max_delay: float = 5.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.max_delay or self.multiplier < 1:
            raise ValueError("need 0 < initial <= max_delay and multiplier >= 1")

    def ceiling(self, retry: int) -> float:
        """The largest delay before retry number `retry` (1 for the first retry)."""
        try:
            grown = self.initial * self.multiplier ** max(retry - 1, 0)
        except OverflowError:
            # Workers retry claims forever; after enough failures the power overflows.
            return self.max_delay
        return min(self.max_delay, grown)

    def delay(self, retry: int, rand: Callable[[], float] = random.random) -> float:
        ceiling = self.ceiling(retry)
        return ceiling / 2 + rand() * ceiling / 2
