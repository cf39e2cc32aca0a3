"""A worker's settings: defaults, limits, and the checks made when a `Worker` is built."""

from __future__ import annotations

import os
import re
import secrets
import socket
from dataclasses import dataclass
from typing import Final

from evora.protocol.bounds import MAX_CLAIM_QUEUES, MAX_WAIT_SECONDS, QUEUE_PATTERN
from evora.protocol.retries import RetryBackoff

DEFAULT_DISPATCHER_URL: Final = "http://127.0.0.1:8081"
DEFAULT_CONCURRENCY: Final = 10
# Seconds without an event loop tick before the watchdog warns. Well below any lease (the
# default is 60 s, heartbeats go every third of it) so the warning comes before the damage,
# well above what a healthy loop ever takes for one step.
DEFAULT_BLOCKED_LOOP_WARNING: Final = 1.0
# With wait_seconds=0 (no long-poll), how long an idle worker waits before asking again.
IDLE_PAUSE_SECONDS: Final = 0.5
# While a worker backs off after failed claims, how often it asks whether the dispatcher is
# ready again: it resumes within about this long of the dispatcher (and its database) being
# back, however long the backoff has grown.
READY_PROBE_SECONDS: Final = 1.0
_QUEUE_RE = re.compile(QUEUE_PATTERN)


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a `Worker` was configured with; see `Worker` for the meaning."""

    url: str
    token: str | None
    queues: tuple[str, ...]
    concurrency: int
    worker_id: str
    types: tuple[str, ...] | None
    wait_seconds: float
    grace_period: float
    heartbeat_fraction: float
    cancel_grace: float
    ack_linger: float
    ack_batch_size: int
    request_timeout: float
    shutdown_timeout: float
    backoff: RetryBackoff
    handler_threads: int | None = None
    blocked_loop_warning: float | None = DEFAULT_BLOCKED_LOOP_WARNING
    prefetch: int = 0

    def __post_init__(self) -> None:
        if not 1 <= len(self.queues) <= MAX_CLAIM_QUEUES:
            raise ValueError(f"a worker needs 1..{MAX_CLAIM_QUEUES} queues, got {len(self.queues)}")
        for queue in self.queues:
            if not _QUEUE_RE.fullmatch(queue):
                raise ValueError(f"invalid queue name {queue!r}")
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 0 <= self.wait_seconds <= MAX_WAIT_SECONDS:
            raise ValueError(f"wait_seconds must be 0..{MAX_WAIT_SECONDS}")
        if not 0 < self.heartbeat_fraction < 1:
            raise ValueError("heartbeat_fraction must be between 0 and 1")
        if min(self.grace_period, self.cancel_grace, self.ack_linger) < 0:
            raise ValueError("grace_period, cancel_grace and ack_linger must not be negative")
        if min(self.request_timeout, self.shutdown_timeout) <= 0:
            raise ValueError("request_timeout and shutdown_timeout must be positive")
        if self.prefetch < 0:
            raise ValueError("prefetch must not be negative")
        if self.handler_threads is not None and self.handler_threads < 1:
            raise ValueError("handler_threads must be at least 1")
        if self.blocked_loop_warning is not None and self.blocked_loop_warning <= 0:
            raise ValueError("blocked_loop_warning must be positive (or None: no watchdog)")
