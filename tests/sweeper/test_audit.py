"""The sweeper's incremental audit (docs/audit.md): the active sweeper audits the events
written since its last pass, a bounded batch at a time, and counts what it finds in
`evora_invariant_violations_total{check}`."""

from __future__ import annotations

from dataclasses import replace

import asyncpg
import pytest

from evora.storage.audit import CHECKS
from evora.storage.jobs import JobStore
from tests.polling import until
from tests.sweeper.conftest import FAST, StartSweeper, claimed, submit

AUDITING = replace(FAST, audit_every=0.2, audit_batch=3)


@pytest.mark.audit_skip(reason="the test breaks the history to see the sweeper count it")
async def test_the_active_sweeper_counts_violations_by_check(
    start_sweeper: StartSweeper, store: JobStore, pool: asyncpg.Pool
) -> None:
    sound = await claimed(store)
    await store.complete(sound["id"], sound["lease_token"])
    running = await start_sweeper(AUDITING)
    await until(lambda: running.active, "the sweeper to become active")
    # every check is exported from the first scrape, at zero
    for check in CHECKS:
        assert running.metric("evora_invariant_violations_total", check=check) == 0
    await until(lambda: running.metric("evora_audit_events_total") == 3, "the first pass to read 3")

    # a change no event records, then events the next passes read, three at a time
    broken = await submit(store)
    await pool.execute(
        "UPDATE evora.jobs SET state = 'CANCELLED', finished_at = now() WHERE id = $1", broken
    )
    for _ in range(4):
        await submit(store)
    await until(lambda: running.metric("evora_audit_events_total") == 8, "the passes to read all 8")
    assert running.metric("evora_invariant_violations_total", check="ends_in_current_state") == 1
    assert (
        sum(running.metric("evora_invariant_violations_total", check=check) for check in CHECKS)
        == 1
    )
