"""Where a cursor of the release before migration 0068 goes on in today's listing.

That release paged the admin listing by submission number and its cursor named the
submit_seq of a page's last job; today's pages by id (a UUIDv7, ordered by the time it was
made) and no index orders the jobs by submit_seq. Reading the table for the newest job below
a submit_seq costs a scan of every job, which on a large table outlasts the statement
timeout. Both numbers grow as jobs are submitted, so a bisection of the ids' milliseconds
finds where the submit_seqs pass the cursor's with one primary-key probe per step (48 at
most), and one bounded read of the jobs around that point picks the answer exactly: exact
while the clocks that made the ids were within `WINDOW_MS` of each other and of the order in
which the jobs were stored.
"""

from __future__ import annotations

from uuid import UUID

import asyncpg

from evora.storage import queries

# A UUIDv7's first 48 bits are its Unix time in milliseconds.
_MS_SHIFT = 80
_MS_END = 1 << 48
# How far from the bisection's point the jobs are read whole: the clock skew between the
# api replicas and the database, and the time between making an id and storing its job, that
# the answer tolerates.
WINDOW_MS = 2_000


def _first_id_of(ms: int) -> UUID:
    """The lowest id a UUIDv7 made in millisecond `ms` can have (past the last millisecond:
    the highest id)."""
    if ms >= _MS_END:
        return UUID(int=(1 << 128) - 1)
    return UUID(int=max(ms, 0) << _MS_SHIFT)


async def resumed_after_seq(conn: asyncpg.Connection, seq: int) -> UUID | None:
    """The id of the newest job submitted before submit_seq `seq` (where that release's
    listing would have gone on), or None when no job is below it."""
    # invariant: the first job at or after `low`'s millisecond has a submit_seq below `seq`
    # (or `low` is 0), and the first at or after `high`'s has none below it (or there is none)
    low, high = 0, _MS_END
    while high - low > 1:
        middle = (low + high) // 2
        found = await conn.fetchrow(queries.LISTING_PROBE, _first_id_of(middle))
        if found is None or found["submit_seq"] >= seq:
            high = middle
        else:
            # the probe's job may lie further on: no job lies between here and it (kept
            # below `high` against jobs stored meanwhile)
            low = min(max(middle, found["id"].int >> _MS_SHIFT), high - 1)
    resumed: UUID | None = await conn.fetchval(
        queries.LISTING_RESUMED,
        seq,
        _first_id_of(high - WINDOW_MS),
        _first_id_of(high + WINDOW_MS),
    )
    return resumed
