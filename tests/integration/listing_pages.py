"""Every listing the api builds, page by page, as plain data: the upgrade test takes it with
the earlier release's code (a copy of this file runs in that release's tree) and with today's,
and compares. It uses only what both releases' JobStore offer."""

from __future__ import annotations

from typing import Any

from evora.protocol.states import JobState

FILTERS: tuple[dict[str, Any], ...] = (
    {},
    {"queue": "alpha"},
    {"state": JobState.RUNNING},
    {"type": "b"},
)
STATES = (None, JobState.PENDING, JobState.RUNNING, JobState.COMPLETED)


async def every_page(store: Any, limit: int = 7) -> list[list[list[str]]]:
    """For each filter and state: the (id, state) of every job listed, in the listing's order."""
    listed = []
    for filters in FILTERS:
        for state in STATES:
            chosen: dict[str, Any] = {**filters, **({"state": state} if state else {})}
            seen: list[list[str]] = []
            after = None
            while True:
                page = await store.list_jobs(**chosen, limit=limit, after=after)
                seen += [[str(j["id"]), str(j["state"])] for j in page.jobs]
                if page.next_after is None:
                    break
                after = page.next_after
            listed.append(seen)
    return listed
