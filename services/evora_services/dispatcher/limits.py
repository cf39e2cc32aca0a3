"""Flow-control metrics (docs/metrics.md, docs/flow-control.md): per kind of limit key (what
precedes its first `:`, e.g. `tenant`, `queue`), how many jobs run under limits, the tokens
left in their buckets, how many due jobs the limits hold back and for how long; and per
limit, until when an upstream's retry-after drains a key it governs.

Read every `CHECK_SECONDS` on its own schedule, never on the claim path, and only while any
limit exists. Kinds are named by producers, so at most `MAX_KINDS` get a series of their own;
the rest are summed under `_other`. Every dispatcher replica reports the same figures.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
from prometheus_client import CollectorRegistry, Gauge

from evora.storage.limits import KindUsage, LimitStore

log = logging.getLogger(__name__)

CHECK_SECONDS = 15.0
MAX_KINDS = 50
OTHER = "_other"


class LimitWatch:
    def __init__(self, limits: LimitStore, registry: CollectorRegistry) -> None:
        self._limits = limits
        labels = ["kind"]
        self._running = Gauge(
            "evora_limit_running_jobs",
            "RUNNING jobs holding a limited key, summed over the keys of a kind.",
            labels,
            registry=registry,
        )
        self._tokens = Gauge(
            "evora_limit_tokens",
            "Tokens left in the buckets of the rate-limited keys of a kind.",
            labels,
            registry=registry,
        )
        self._throttled = Gauge(
            "evora_limit_throttled_jobs",
            "Due PENDING jobs held back by a limit (a key of the kind without room left).",
            labels,
            registry=registry,
        )
        self._throttled_seconds = Gauge(
            "evora_limit_throttled_seconds",
            "How long the longest-held-back job of a kind has been due.",
            labels,
            registry=registry,
        )
        # labelled by a limit's own key (configured, so a bounded set), not by the keys under a
        # prefix limit, which producers name
        self._upstream = Gauge(
            "evora_limit_throttled_until_seconds",
            "Until when (Unix time) an upstream's retry-after drains a key the limit governs.",
            ["key"],
            registry=registry,
        )
        # the kinds with series now, and those of them with a tokens series
        self._shown: set[str] = set()
        self._rated: set[str] = set()
        self._throttled_limits: set[str] = set()

    async def check(self) -> dict[str, KindUsage]:
        throttled = await self._limits.throttled_until()
        for key in self._throttled_limits - throttled.keys():
            self._upstream.remove(key)
        for key, until in throttled.items():
            self._upstream.labels(key).set(until.timestamp())
        self._throttled_limits = set(throttled)
        usage = _capped(await self._limits.usage_by_kind())
        rated = {kind for kind, found in usage.items() if found.tokens is not None}
        for kind in self._shown - usage.keys():
            for gauge in (self._running, self._throttled, self._throttled_seconds):
                gauge.remove(kind)
        for kind in self._rated - rated:
            self._tokens.remove(kind)
        for kind, found in usage.items():
            self._running.labels(kind).set(found.running)
            self._throttled.labels(kind).set(found.throttled_jobs)
            self._throttled_seconds.labels(kind).set(found.throttled_seconds)
            if found.tokens is not None:
                self._tokens.labels(kind).set(found.tokens)
        self._shown, self._rated = set(usage), rated
        return usage

    async def run_forever(self) -> None:
        while True:
            try:
                await self.check()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                # The database is away: the claim path reports that; try again later.
                log.debug("flow-control metrics check failed: %s", exc)
            await asyncio.sleep(CHECK_SECONDS)


def _capped(found: list[KindUsage]) -> dict[str, KindUsage]:
    """The first MAX_KINDS kinds (by name) on their own, the rest summed under `_other`."""
    kept = {u.kind: u for u in found[:MAX_KINDS]}
    rest = found[MAX_KINDS:]
    if rest:
        tokens = [u.tokens for u in rest if u.tokens is not None]
        kept[OTHER] = KindUsage(
            OTHER,
            sum(u.running for u in rest),
            sum(tokens) if tokens else None,
            sum(u.throttled_jobs for u in rest),
            max(u.throttled_seconds for u in rest),
        )
    return kept
