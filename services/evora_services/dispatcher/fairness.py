"""Fair-scheduling metrics (docs/metrics.md, docs/flow-control.md "Fairness keys"): per fair
queue and kind of fairness key (what precedes its first `:`, e.g. `tenant`, `gold`), the keys
with work, the due jobs waiting and how long the longest has waited, and the lease seconds
their attempts held (the kind's share of the queue's workers is the rate of that over the
queue's sum).

Read every `CHECK_SECONDS` on its own schedule, never on the claim path. Kinds are named by
producers, so at most `MAX_SERIES` (queue, kind) pairs get series of their own, the rest are
summed per queue under `_other`. Every dispatcher replica reports the same figures.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
from prometheus_client import CollectorRegistry, Gauge

from evora.storage.fairness import FairnessStore, KindService

log = logging.getLogger(__name__)

CHECK_SECONDS = 15.0
MAX_SERIES = 100
OTHER = "_other"

Labels = tuple[str, str]


class FairnessWatch:
    def __init__(self, fairness: FairnessStore, registry: CollectorRegistry) -> None:
        self._fairness = fairness
        labels = ["queue", "kind"]
        self._backlogged = Gauge(
            "evora_fair_backlogged_keys",
            "Fairness keys of a kind with work waiting in a fair queue.",
            labels,
            registry=registry,
        )
        self._waiting = Gauge(
            "evora_fair_waiting_jobs",
            "Due PENDING jobs of a kind's fairness keys in a fair queue.",
            labels,
            registry=registry,
        )
        self._waited = Gauge(
            "evora_fair_waiting_seconds",
            "How long the longest-waiting due job of a kind has waited.",
            labels,
            registry=registry,
        )
        self._held = Gauge(
            "evora_fair_held_seconds",
            "Lease seconds the ended attempts of a kind's keys held (only grows: its rate "
            "over the queue's sum is the kind's share of the workers).",
            labels,
            registry=registry,
        )
        self._shown: set[Labels] = set()

    async def check(self) -> dict[Labels, KindService]:
        found = _capped(await self._fairness.by_kind())
        gauges = (self._backlogged, self._waiting, self._waited, self._held)
        for labels in self._shown - found.keys():
            for gauge in gauges:
                gauge.remove(*labels)
        for labels, service in found.items():
            self._backlogged.labels(*labels).set(service.backlogged_keys)
            self._waiting.labels(*labels).set(service.waiting_jobs)
            self._waited.labels(*labels).set(service.waiting_seconds)
            self._held.labels(*labels).set(service.held_seconds)
        self._shown = set(found)
        return found

    async def run_forever(self) -> None:
        while True:
            try:
                await self.check()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                # The database is away: the claim path reports that; try again later.
                log.debug("fairness metrics check failed: %s", exc)
            await asyncio.sleep(CHECK_SECONDS)


def _capped(found: list[KindService]) -> dict[Labels, KindService]:
    """The first MAX_SERIES (queue, kind) pairs on their own, the rest summed per queue under
    `_other`."""
    kept = {(s.queue, s.kind): s for s in found[:MAX_SERIES]}
    for s in found[MAX_SERIES:]:
        was = kept.get((s.queue, OTHER), KindService(s.queue, OTHER, 0, 0, 0.0, 0.0, 0))
        kept[(s.queue, OTHER)] = KindService(
            s.queue,
            OTHER,
            was.backlogged_keys + s.backlogged_keys,
            was.waiting_jobs + s.waiting_jobs,
            max(was.waiting_seconds, s.waiting_seconds),
            was.held_seconds + s.held_seconds,
            was.served + s.served,
        )
    return kept
