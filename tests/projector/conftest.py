from __future__ import annotations

import asyncpg
import pytest

from evora.storage import outbox
from evora_services.projector.projector import ProjectionConflict, Projector


async def truth(
    pool: asyncpg.Pool,
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]], int]:
    """PostgreSQL's own answer: counts per queue and state, event totals per queue and
    name, and the newest seq."""
    counts: dict[str, dict[str, int]] = {}
    for r in await pool.fetch(
        "SELECT queue, state::text, count(*) AS n FROM evora.jobs GROUP BY 1, 2"
    ):
        counts.setdefault(r["queue"], {})[r["state"]] = r["n"]
    totals: dict[str, dict[str, int]] = {}
    for r in await pool.fetch(
        "SELECT queue, event, count(*) AS n FROM evora.job_events GROUP BY 1, 2"
    ):
        totals.setdefault(r["queue"], {})[r["event"]] = r["n"]
    newest = await pool.fetchval("SELECT coalesce(max(seq), 0) FROM evora.job_events")
    return counts, totals, int(newest)


async def catch_up(projector: Projector) -> int:
    """Apply everything the outbox holds, then refresh; returns the events applied."""
    applied = 0
    while batch := await projector.run_once():
        applied += batch
    await projector.refresh()
    return applied


async def catch_up_replaying(projector: Projector) -> None:
    """catch_up, replaying a batch abandoned on a conflict as the service does: a write that
    another writer made, or that MongoDB applied late or lost, fails its compare-and-set."""
    while True:
        try:
            await catch_up(projector)
            return
        except ProjectionConflict:
            pass


def without_target_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """This projector as releases before migration 0060 ran it, for an upgrade test's part
    before that migration: a new span target is not written to `evora.outbox_target` (the
    table does not exist yet); `monkeypatch.undo()` rolls it forward."""
    monkeypatch.setattr(outbox, "TARGET_TAKEN", "SELECT $1::text")
