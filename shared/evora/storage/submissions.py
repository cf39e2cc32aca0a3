"""Submitting jobs: new ids, and the answer for every item of a set of submissions.

The rules live in the database, in evora.store_submissions() (its current text is in
storage/functions/submissions.sql), which is also what
applications run when they submit in SQL (evora.submit): an idempotency key is stored with a
fingerprint of the submission's fields in the same statement as its job; a key seen before
replays its job when the fields match and is an idempotency conflict when they differ. Here
each item's outcome becomes the job or the error the api answers. Dependencies on earlier
items of the same batch ("ref:<name>") become those items' new ids here, before the
statement; whether the other ids name jobs is the database's answer.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg
import orjson
from asyncpg.pgproto.pgproto import UUID as PgUUID

from evora.domain.errors import (
    EvoraError,
    IdempotencyConflict,
    IdempotentJobGone,
    InvalidDependency,
    QueueFull,
)
from evora.protocol.bounds import DEPENDENCY_REF_PREFIX
from evora.protocol.jobs import JobSubmission
from evora.storage.queries import briefly
from evora.storage.rows import JobDict, job_from_row
from evora.storage.statements import load

(SUBMIT,) = load("submit", "submit")

# What evora.admit() raises when a key would hold more jobs waiting than its max_pending
# (functions/submissions.sql); its DETAIL is the key.
QUEUE_FULL_SQLSTATE = "EV429"

# Runs a transition statement and settles its NOTIFY hints (JobStore._change).
Change = Callable[..., Awaitable[list[asyncpg.Record]]]


# The fixed bits of a UUIDv7 (RFC 9562) besides its time: version 7, variant 0b10.
_VERSION_AND_VARIANT = (0x7 << 76) | (0b10 << 62)
# The bits left random: rand_b (62 bits).
_RANDOM_BITS = (1 << 62) - 1
# The time of the newest ids made: unix milliseconds, then 12 bits of the millisecond's fraction.
_last_stamp = 0


def uuid7s(count: int) -> list[UUID]:
    """Time-ordered UUIDs (RFC 9562 version 7) for new jobs, in order: consecutive ids land
    on the same primary-key pages, where random ids would touch (and WAL-log) a page per
    insert once the table is large, and the admin listing shows the jobs in their ids' order
    (migration 0068). The millisecond's fraction fills rand_a (12 bits, RFC 9562's third
    method) and never goes back within the process, so each call's ids follow the last
    call's; a call's ids share it and are sorted, so they follow the order of the items they
    go to. One read of the system's randomness serves a whole batch and its fixed bits are
    set for every id at once (one integer of 128 bits per id, masked in C); the ids are
    asyncpg's own UUIDs, which it encodes without a call per id."""
    global _last_stamp
    milliseconds, fraction = divmod(time.time_ns(), 1_000_000)
    stamp = max((milliseconds << 12) | (fraction * 4096 // 1_000_000), _last_stamp + 1)
    _last_stamp = stamp
    head = ((stamp >> 12) << 80) | ((stamp & 0xFFF) << 64) | _VERSION_AND_VARIANT
    mask = int.from_bytes(_RANDOM_BITS.to_bytes(16, "big") * count, "big")
    fixed = int.from_bytes(head.to_bytes(16, "big") * count, "big")
    noise = int.from_bytes(os.urandom(16 * count), "big")
    raw = ((noise & mask) | fixed).to_bytes(16 * count, "big")
    return [
        PgUUID(one) for one in sorted(raw[start : start + 16] for start in range(0, 16 * count, 16))
    ]


def _per_item(values: list[Any]) -> list[Any]:
    """A column of the submissions as the statement takes it: one element when every item
    has the same value (evora.for_each_item spreads it), which spares asyncpg a type check
    and an encoding per element, else one element per item. Equal is not enough for a zero:
    0.0 == -0.0, yet they are different float8 values (and idempotency fingerprints)."""
    first = values[0]
    if values.count(first) != len(values):
        return values
    if first == 0 and len({math.copysign(1.0, value) for value in values}) > 1:
        return values
    return [first]


def _key_reused(sub: JobSubmission) -> str:
    return (
        f"idempotency key {sub.idempotency_key!r} was already used in queue {sub.queue!r} "
        "with different fields"
    )


@dataclass(frozen=True)
class Edges:
    """Every item's dependencies as ids, flattened: item position (from 1) and the job."""

    ords: list[int]
    ids: list[UUID]


def _field(index: int, name: str, batch: bool) -> str:
    return f"jobs[{index}].{name}" if batch else name


def dependency_edges(
    submissions: Sequence[JobSubmission],
    ids: Sequence[UUID],
    *,
    batch: bool,
    own_refs: bool = False,
) -> Edges:
    """Resolve refs to the ids of earlier items. Only earlier items can be named, so a batch
    cannot describe a cycle. With `own_refs` every item is a request of its own (concurrent
    single requests stored together), whose refs no other item sees."""
    named: dict[str, UUID] = {}
    edges = Edges([], [])
    for index, (sub, job_id) in enumerate(zip(submissions, ids, strict=True)):
        if own_refs:
            named = {}
        for place, dep in enumerate(sub.depends_on):
            if isinstance(dep, str):
                name = dep.removeprefix(DEPENDENCY_REF_PREFIX)
                if name not in named:
                    raise InvalidDependency(
                        f"{_field(index, 'depends_on', batch)}[{place}]: {dep!r} names no "
                        "earlier item of this batch"
                    )
                dep = named[name]
            edges.ords.append(index + 1)
            edges.ids.append(dep)
        if sub.ref is not None:
            if sub.ref in named:
                raise InvalidDependency(
                    f"{_field(index, 'ref', batch)}: {sub.ref!r} is already the ref of an "
                    "earlier item"
                )
            named[sub.ref] = job_id
    return edges


# The id a lone item's own ref would stand for: nothing can name it, so it is never stored.
_NO_JOB = UUID(int=0)


def refs_refused(sub: JobSubmission) -> InvalidDependency | None:
    """Why a single request's `ref:` dependencies name nothing, if it has any: it is a batch
    of one, with no earlier item to name, however many other requests share its statement
    (another producer's ref is not its to name, nor is its job sure to exist)."""
    try:
        dependency_edges([sub], [_NO_JOB], batch=False)
    except InvalidDependency as refused:
        return refused
    return None


def needs_transaction(submissions: Sequence[JobSubmission]) -> bool:
    """Whether storing them all or nothing needs a transaction around the statement: it
    answers keyed and dependent items one by one, so one can fail after others were stored."""
    return any(s.idempotency_key is not None or s.depends_on for s in submissions)


@dataclass(frozen=True)
class Submitted:
    id: UUID
    created: bool
    whole: JobDict | None  # the job, when it was asked for
    # "debounced" or "throttled": a key answered with this job (docs/flow-control.md)
    answered_by_key: str | None = None

    @property
    def job(self) -> JobDict:
        if self.whole is None:
            raise ValueError("the submission was stored without asking for its job")
        return self.whole


async def store(
    conn: asyncpg.Connection,
    change: Change,
    submissions: Sequence[JobSubmission],
    *,
    committed: bool,
    name_repeats: bool = False,
    with_jobs: bool = True,
    own_refs: bool = False,
    brief_lock_waits: bool = False,
) -> tuple[list[Submitted | EvoraError], list[asyncpg.Record]]:
    """Store the submissions in one statement; the outcome of each (created, replayed
    or an idempotency error) and the statement's rows. With `name_repeats` (one batch
    request) a key repeated with other fields, and every invalid dependency, is reported by
    item index. Without `with_jobs` the outcomes carry the jobs' ids only. With `own_refs`
    each item's refs are its own (see `dependency_edges`). With `brief_lock_waits` the
    statement gives up waiting for a lock at once (`queries.briefly`)."""
    ids = uuid7s(len(submissions))
    defaults = _defaults_only(submissions)
    edges = (
        Edges([], [])
        if defaults
        else dependency_edges(submissions, ids, batch=name_repeats, own_refs=own_refs)
    )

    try:
        statement = briefly(SUBMIT) if brief_lock_waits else SUBMIT
        rows = await _run(
            conn, change, statement, submissions, ids, edges, committed, with_jobs, defaults
        )
    except asyncpg.PostgresError as exc:
        if exc.sqlstate != QUEUE_FULL_SQLSTATE:
            raise
        raise queue_full(exc, submissions) from exc
    by_position = {row["ord"]: row for row in rows}
    return [
        _outcome(index, sub, by_position[index + 1], name_repeats)
        for index, sub in enumerate(submissions)
    ], rows


def queue_full(exc: asyncpg.PostgresError, submissions: Sequence[JobSubmission]) -> QueueFull:
    """The refusal of evora.admit() as the api answers it, with the queue of the first of
    `submissions` that holds the key."""
    key = str(exc.detail)
    queue = next(s.queue for s in submissions if key == f"queue:{s.queue}" or key in s.limit_keys)
    return QueueFull(str(exc).removeprefix("queue_full: "), key=key, queue=queue)


# The fields every item of a typical batch sets itself. An item that sets no other field
# (pydantic's `model_fields_set`: what the body or the constructor gave) holds every other
# field at its default.
_OFTEN_SET = frozenset({"queue", "type", "payload"})


def _defaults_only(submissions: Sequence[JobSubmission]) -> bool:
    """Whether no item sets a field besides queue, type and payload: then every other column
    of the statement is the first item's default, read once for the batch, and no item has
    a dependency or a ref to resolve. One check of a set per item, instead of reads of 25
    fields per item and comparisons of their values (about a tenth of the api's CPU per job
    of a batch as profiled: docs/benchmarks/2026-11-29-submit-cost.md)."""
    return all(s.model_fields_set <= _OFTEN_SET for s in submissions)


async def _run(
    conn: asyncpg.Connection,
    change: Change,
    statement: str,
    submissions: Sequence[JobSubmission],
    ids: list[UUID],
    edges: Edges,
    committed: bool,
    with_jobs: bool,
    defaults: bool,
) -> list[asyncpg.Record]:
    """The statement (`SUBMIT`, maybe `briefly`); with `defaults` (`_defaults_only`) each
    column besides queue, type and payload is read once, from the first item."""
    first = submissions[0]

    def each(value: Callable[[JobSubmission], Any]) -> list[Any]:
        return [value(first)] if defaults else _per_item([value(s) for s in submissions])

    return await change(
        conn,
        statement,
        ids,
        _per_item([s.queue for s in submissions]),
        _per_item([s.type for s in submissions]),
        [s.payload for s in submissions],
        each(lambda s: s.priority),
        each(lambda s: s.run_at),
        each(lambda s: s.delay_seconds),
        each(lambda s: s.max_attempts),
        each(lambda s: s.lease_seconds),
        each(lambda s: s.backoff.initial_seconds),
        each(lambda s: s.backoff.max_seconds),
        each(lambda s: s.backoff.multiplier),
        each(lambda s: s.expires_at),
        each(lambda s: s.idempotency_key),
        each(lambda s: s.group_key),
        each(_fingerprint_before_0011),
        edges.ords,
        edges.ids,
        each(lambda s: s.on_dependency_failure),
        [] if defaults else [i + 1 for i, s in enumerate(submissions) for _ in s.limit_keys],
        [] if defaults else [key for s in submissions for key in s.limit_keys],
        each(lambda s: s.max_duration_seconds),
        each(lambda s: s.fairness_key),
        each(lambda s: None if s.debounce is None else s.debounce.key),
        each(lambda s: None if s.debounce is None else s.debounce.delay_seconds),
        each(lambda s: None if s.debounce is None else s.debounce.max_delay_seconds),
        each(lambda s: None if s.throttle is None else s.throttle.key),
        each(lambda s: None if s.throttle is None else s.throttle.window_seconds),
        committed=committed,
        with_jobs=with_jobs,
    )


# Fields added after migration 0011: not part of the fingerprints computed before it.
_SINCE_0011 = {
    "depends_on",
    "on_dependency_failure",
    "ref",
    "limit_keys",
    "max_duration_seconds",
    "fairness_key",
    "debounce",
    "throttle",
}


def _fingerprint_before_0011(sub: JobSubmission) -> bytes | None:
    """The fingerprint the api stored with a key before migration 0011 made the database
    compute them: a retry of a submission made then, with the same fields, still replays.
    None for a submission with dependencies, limit keys or a time limit: one made then had
    none, so this fingerprint (which leaves them out) would replay it for any. (Drop it once
    no key from before the upgrade can still be retried.)"""
    if (
        sub.idempotency_key is None
        or sub.depends_on
        or sub.limit_keys
        or sub.max_duration_seconds is not None
    ):
        return None
    # the payload as it is: it may hold the client's exact numbers (orjson fragments)
    fields = sub.model_dump(mode="json", exclude={"idempotency_key", "payload", *_SINCE_0011})
    fields["payload"] = sub.payload
    return hashlib.sha256(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)).digest()


def _outcome(
    index: int, sub: JobSubmission, row: asyncpg.Record, name_repeats: bool
) -> Submitted | EvoraError:
    match row["outcome"]:
        case "created" | "replayed":
            whole = None if row["job"] is None else job_from_row(row["job"])
            return Submitted(row["id"], row["outcome"] == "created", whole)
        case "debounced" | "throttled":
            whole = None if row["job"] is None else job_from_row(row["job"])
            return Submitted(row["id"], False, whole, row["outcome"])
        case "repeat_conflict" if name_repeats:
            return IdempotencyConflict(
                f"jobs[{index}] reuses the idempotency key of jobs[{row['first_ord'] - 1}] "
                "with different fields"
            )
        case "conflict" | "repeat_conflict":
            return IdempotencyConflict(_key_reused(sub))
        case "unknown_dependency" | "cancelled_dependency":
            place = row["first_ord"] - 1
            problem = (
                "names no job"
                if row["outcome"] == "unknown_dependency"
                else 'names a CANCELLED job (with on_dependency_failure "cancel" this job '
                "could never run)"
            )
            return InvalidDependency(
                f"{_field(index, 'depends_on', name_repeats)}[{place}]: "
                f"{sub.depends_on[place]} {problem}"
            )
        case "gone":
            return IdempotentJobGone(
                f"idempotency key {sub.idempotency_key!r} was used in queue {sub.queue!r} "
                "by a job that has since been removed"
            )
    raise ValueError(f"evora.store_submissions answered an unknown outcome {row['outcome']!r}")
