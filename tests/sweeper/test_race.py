"""A completion arriving just as the sweeper expires the lease: exactly one of them wins and
the other changes nothing (no state change, no event). The running sweeper's loop sweeps
too, so the completion races against it as well as against the pass started here."""

from __future__ import annotations

import asyncio
from collections import Counter

import asyncpg

from evora.domain.errors import LeaseLost
from evora.storage.jobs import JobStore
from evora_services.sweeper.sweeper import Tuning
from tests.sweeper.conftest import StartSweeper, claimed, event_names, force_lease_expiry

ROUNDS = 40


async def test_completion_racing_expiry_has_exactly_one_winner(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool
) -> None:
    running = await start_sweeper(Tuning(max_wait=0.02, min_wait=0.0))
    winners: Counter[str] = Counter()
    for round_ in range(ROUNDS):
        job = await claimed(store, f"race-{round_}", max_attempts=5)
        await force_lease_expiry(pool, job["id"])
        expire = running.sweeper.expire_due()
        complete = store.complete(job["id"], job["lease_token"], {"round": round_})
        async with asyncio.timeout(10):
            if round_ % 2:
                _, completed = await asyncio.gather(expire, complete, return_exceptions=True)
            else:
                completed, _ = await asyncio.gather(complete, expire, return_exceptions=True)

        current = await store.get(job["id"])
        names = await event_names(pool, job["id"])
        if isinstance(completed, BaseException):
            assert isinstance(completed, LeaseLost), repr(completed)
            winners["expiry"] += 1
            assert names == ["submitted", "claimed", "lease_expired"], round_
            assert current["state"] == "PENDING" and current["result"] is None
        else:
            winners["completion"] += 1
            assert names == ["submitted", "claimed", "completed"], round_
            assert current["state"] == "COMPLETED" and current["result"] == {"round": round_}
    assert winners.total() == ROUNDS
    # Every lease the sweeper counted is one the completion lost, and no other.
    requeued = running.metric("evora_sweeper_leases_expired_total", outcome="requeued")
    assert requeued == winners["expiry"]
    print(f"expiry/completion race winners: {dict(winners)}")
