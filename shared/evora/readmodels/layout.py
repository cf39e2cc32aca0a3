"""Where the read models live in MongoDB.

Read models are kept in generations: collections `rm{N}_*` hold generation N, and the
control document names the generation readers use. A rebuild writes generation N+1 from
the start of the outbox, then flips the control document: readers switch at once, with no
window in which stats are missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from evora.protocol.states import JobState

Document = dict[str, Any]

CONTROL = "projector_control"
CONTROL_ID = "control"
STATE_NAMES = tuple(JobState)
# The stats `totals` keys (docs/http-api.md#queue-stats); the projector counts every event
# name, these are the ones the api promises.
TOTAL_KEYS = ("submitted", "completed", "failed", "dead_lettered", "retried", "lease_expired")


def checkpoint_id(generation: int) -> str:
    return f"checkpoint:{generation}"


@dataclass(frozen=True)
class Generation:
    number: int
    queues: AsyncCollection[Document]
    workers: AsyncCollection[Document]
    failures: AsyncCollection[Document]

    @classmethod
    def of(cls, db: AsyncDatabase[Document], number: int) -> Generation:
        prefix = f"rm{number}_"
        return cls(
            number,
            db[prefix + "queues"],
            db[prefix + "workers"],
            db[prefix + "failures"],
        )

    def all(self) -> list[AsyncCollection[Document]]:
        return [self.queues, self.workers, self.failures]


async def active_generation(db: AsyncDatabase[Document]) -> int:
    control = await db[CONTROL].find_one({"_id": CONTROL_ID})
    return int(control["generation"]) if control else 1


async def ensure_indexes(generation: Generation) -> None:
    await generation.queues.create_index([("last_event_at", -1)])
    await generation.workers.create_index([("last_seen", -1)])
    await generation.failures.create_index([("queue", 1), ("type", 1)])
