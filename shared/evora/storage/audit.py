"""The auditor: checks the system's invariants against the event history and the tables
(docs/audit.md says what each check means and what it cannot see).

`audit()` reads, in one REPEATABLE READ transaction, the `job_events` from a starting seq
(all of them, or those of a recent time window, or those after an earlier audit's last seq),
streams them in seq order and keeps a few facts per job, then compares with the rows the
events describe (sql/audit.sql). Each check is named; a violation names the jobs and the
events (seqs) that break it. Seq order is the order of writes across jobs (docs/
architecture.md): `at` is the writing transaction's start, so it only serves the checks that
are about time (rate limits) and the window of `--since`.

A history may be truncated: retention drops archived events oldest first, and a window
starts wherever it was asked to. Each job's chain is therefore checked from its oldest event
in the window on; what happened before it (an attempt already running, a group's running
job, a limit's RUNNING count) is unknown and assumed to break nothing, so a window can miss a
violation that straddles its start but never reports one that is not there.
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg

from evora.domain.states import TRANSITIONS
from evora.storage.statements import load

(
    _FIRST_SEQ_SINCE,
    _LAST_SEQ,
    _NEXT_SEQ,
    _CLOCK_OFFSET,
    _EVENTS,
    _NEXT_EVENTS,
    _CLOSE_EVENTS,
    _JOBS_OF,
    _DEPENDENCIES_OF,
    _WAITING_ON_MISSING,
    _OVER_MAX_PENDING,
    _SUSPENDED_MISMATCH,
    _LIMIT_CHANGES,
    _ARCHIVED_UPTO,
    _PRUNE_COUNTS,
    _FAIR_BACKLOG_UNWALKED,
    _FAIR_RUNNING_OVERCOUNTED,
) = load(
    "audit",
    "first_seq_since",
    "last_seq",
    "next_seq",
    "clock_offset",
    "events",
    "next_events",
    "close_events",
    "jobs_of",
    "dependencies_of",
    "waiting_on_missing",
    "over_max_pending",
    "suspended_mismatch",
    "limit_changes",
    "archived_upto",
    "prune_counts",
    "fair_backlog_unwalked",
    "fair_running_overcounted",
)

# The width of the ranges of seq the auditor reads the history in: each is read whole and
# sorted in memory (at most this many events), then fetched a batch at a time (sql/audit.sql).
_EVENTS_PER_RANGE = 10_000

# Every check, in report order, with what it means (docs/audit.md says more).
CHECKS: dict[str, str] = {
    "transitions_legal": "every event is a move the state machine allows",
    "chain_continuous": (
        "a job's events have consecutive versions, each starting in the state the one before "
        "ended in; version 1 is `submitted`"
    ),
    "ends_in_current_state": "a job's last event carries its current state and version",
    "attempts_counted": (
        "a claim raises the attempt by one, a release, snooze or resumption (from SUSPENDED) "
        "to PENDING lowers it by one, a retry from the DLQ resets it, nothing else changes it"
    ),
    "snoozes_counted": (
        "a job's `snoozes` is the number of its `snoozed` events back to PENDING (jobs whose "
        "whole history is in the window)"
    ),
    "one_claim_per_attempt": (
        "every event of a running attempt (cancel request, completion, failure, release, "
        "expiry) belongs to the claim that opened it: same attempt, start and worker"
    ),
    "group_exclusive": (
        "at most one RUNNING or SUSPENDED job per (queue, group_key) at any moment (a "
        "suspended job keeps its group's turn)"
    ),
    "group_order": (
        "a grouped job is claimed only as its group's head: no job of the group that comes "
        "before it (priority, then submission) was PENDING"
    ),
    "concurrency_limits": "no claim makes a key's RUNNING jobs exceed its concurrency limit",
    "rate_limits": "a key's claims fit its token bucket over every window",
    "schedule_tick_once": "each schedule tick made at most one job",
    "dependencies_before_start": (
        "a job becomes PENDING (and so is claimed) only after each of its dependencies "
        "completed, or was cancelled and the job runs anyway"
    ),
    "cancel_honoured": (
        "after a cancel request the attempt ends CANCELLED, or COMPLETED when the worker "
        "finished first; it never goes back to PENDING"
    ),
    "no_job_lost": (
        "every job with a submitted event exists, or finished and was counted as pruned by "
        "retention"
    ),
    "waiting_on_existing": "no WAITING job depends on a job that no longer exists",
    "suspended_on_its_callback": (
        "every SUSPENDED job holds no lease and waits on exactly one open callback, the one "
        "it names; every open callback's job is SUSPENDED on it"
    ),
    "max_pending_admitted": (
        "no key holds more never-started jobs waiting to run, submitted since its limit last "
        "changed, than its max_pending"
    ),
    "fair_backlog_walked": (
        "every keyed job waiting to run is in a fair queue, and its key is walked by the "
        "queue's fair claims or noted in the ledger for the next one"
    ),
    "fair_running_counted": (
        "a key's attempts charged in advance are no more than its RUNNING jobs plus the "
        "endings not folded yet"
    ),
    "fair_virtual_time": (
        "a fair claim reads its queue's virtual time at or past every start tag an earlier "
        "claim of the queue served, and serves no job ahead of it"
    ),
}

# The moves events record beside the state machine's: a cancel request of a RUNNING job, a
# checkpoint its handler recorded, and a submission a debounce key's PENDING job absorbed
# (docs/flow-control.md).
_ALLOWED = {(t.from_state, t.to_state, t.event) for t in TRANSITIONS} | {
    ("RUNNING", "RUNNING", "cancel_requested"),
    ("RUNNING", "RUNNING", "checkpointed"),
    ("PENDING", "PENDING", "debounced"),
}
_FINISHED = frozenset({"COMPLETED", "CANCELLED", "DLQ"})
# A claim handed back uncounted: a release, a snooze (which asks to run later), a
# resumption of a suspended job (its callback resolved, or timed out with on_timeout resume),
# or a job that waits for the children it submitted (to WAITING, or PENDING if none is left)
_HANDED_BACK = frozenset({"released", "snoozed", "resumed", "awaiting_children"})
_HANDED_BACK_TO = frozenset({"PENDING", "WAITING"})
# group_order: a job that became PENDING this long (by `at`, its transaction's start) before
# a claim was visible to it, unless its transaction stayed open longer; a shorter wait may be
# a submission the claim's snapshot could not see yet, though its seq is lower
_GROUP_ORDER_MARGIN_S = 300.0
# a claim that began up to this long after a limit's change began may not have seen it
# (docs/flow-control.md: the PUT answers after the transactions of the 5 s before it)
_LIMIT_CHANGE_MARGIN_S = 5.0
# rate checks compare transaction start times, not the instant each claim took its token:
# one token, plus what the bucket refills in this long, absorbs that difference
_RATE_SLACK_TOKENS = 1.0
_RATE_SLACK_S = 0.25


@dataclass(frozen=True)
class Violation:
    check: str
    detail: str
    job_ids: tuple[str, ...] = ()
    seqs: tuple[int, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "detail": self.detail,
            "job_ids": list(self.job_ids),
            "seqs": list(self.seqs),
        }


@dataclass
class CheckResult:
    name: str
    meaning: str
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclass
class AuditReport:
    from_seq: int
    # the last seq the audit read (from_seq - 1 when it read none): where the next resumes
    to_seq: int
    events: int
    jobs: int
    checks: list[CheckResult]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def violations(self) -> list[Violation]:
        return [v for c in self.checks for v in c.violations]

    def check(self, name: str) -> CheckResult:
        return next(c for c in self.checks if c.name == name)

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "from_seq": self.from_seq,
            "to_seq": self.to_seq,
            "events": self.events,
            "jobs": self.jobs,
            "checks": {
                c.name: {
                    "ok": c.ok,
                    "meaning": c.meaning,
                    "violations": [v.as_json() for v in c.violations],
                }
                for c in self.checks
            },
        }

    def text(self) -> str:
        """What `evora audit` prints: one line per check, then each violation."""
        lines = [
            f"audited {self.events} events of {self.jobs} jobs (seq {self.from_seq}..{self.to_seq})"
        ]
        for c in self.checks:
            lines.append(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {len(c.violations)} violations")
            for v in c.violations:
                jobs = f" jobs {', '.join(v.job_ids)}" if v.job_ids else ""
                seqs = f" seqs {', '.join(map(str, v.seqs))}" if v.seqs else ""
                lines.append(f"     {v.detail}{jobs}{seqs}")
        return "\n".join(lines)

    def dumps(self) -> str:
        return json.dumps(self.as_json(), indent=2)


@dataclass(slots=True)
class _Claim:
    """The open attempt of a job: its claim's seq and what the attempt's events repeat."""

    seq: int
    attempt: int
    started_at: float | None
    worker: str | None


@dataclass(slots=True)
class _Job:
    """What the audit keeps of one job while it streams the events."""

    queue: str
    version: int
    state: str
    attempt: int
    group_key: str | None = None
    submitted_seq: int | None = None
    # the first event that made the job PENDING from submission (submitted or
    # dependencies_met): only then could it be claimed
    released_seq: int | None = None
    released_xid: str | None = None
    claim: _Claim | None = None
    cancel_requested_seq: int | None = None
    # the first event that ended it for its dependents: completed or cancelled
    ended_seq: int | None = None
    ended_state: str | None = None
    ended_xid: str | None = None
    last_seq: int = 0
    snoozes: int = 0
    # the limit keys its `submitted` event names (None: an older event, which does not)
    limit_keys: tuple[str, ...] | None = None


class _Auditor:
    """The checks made while the events stream. What it keeps for the whole window is a job's
    `_Job` and, for the checks after the stream, tuples of ids (text), seqs and times: tuples
    of such values the cyclic garbage collector stops tracking, so its full collections,
    whose number and cost grow with what the process holds, stay cheap as the window grows
    (with a `uuid` per event kept, they were a third of the auditor's CPU)."""

    def __init__(self, archived_upto: int) -> None:
        # events up to this seq may have been dropped by retention (evora.drop_archived_events)
        self.archived_upto = archived_upto
        self.results = {name: CheckResult(name, meaning) for name, meaning in CHECKS.items()}
        self.jobs: dict[str, _Job] = {}
        # every claim: the job, its seq and `at` (for the limit checks after the stream)
        self.claims: list[tuple[str, int, float]] = []
        # the jobs of each (queue, group) with an attempt open
        self.group_running: dict[tuple[str, str], set[str]] = defaultdict(set)
        # the PENDING jobs of each (queue, group): (priority, submit_seq), since when (at, seq)
        self.group_pending: dict[tuple[str, str], dict[str, tuple[tuple[int, int], float, int]]] = (
            defaultdict(dict)
        )
        self.ticks: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
        # per fair queue: the largest start tag its earlier claims served, with its seq, and
        # the claim being read (its transaction, the largest tag it served and its seq)
        self.fair_served: dict[str, tuple[float, int]] = {}
        self.fair_claim: dict[str, tuple[str, float, int]] = {}
        self.endings: list[tuple[str, int]] = []
        self.events = 0

    def fail(self, check: str, detail: str, jobs: Iterable[object], seqs: Iterable[int]) -> None:
        self.results[check].violations.append(
            Violation(check, detail, tuple(str(j) for j in jobs), tuple(seqs))
        )

    def event(self, e: asyncpg.Record) -> None:
        """One event, in seq order. Its columns are unpacked once, by position (the `events`
        statement's order): a lookup by name per use cost more than the checks."""
        (seq, xid, job_id, version, queue, name, frm, to, attempt, at, worker, started_at,
         group_key, priority, submit_seq, schedule, tick, limit_keys, fair_tag,
         fair_vtime) = e  # fmt: skip
        self.events += 1
        if (frm, to, name) not in _ALLOWED:
            self.fail("transitions_legal", f"{name}: {frm} -> {to}", [job_id], [seq])
        job = self.jobs.get(job_id)
        if job is None:
            if version == 1 and (name != "submitted" or frm is not None):
                self.fail("chain_continuous", f"version 1 is {name}", [job_id], [seq])
            job = _Job(queue, version - 1, frm or "", attempt)
            self.jobs[job_id] = job
        elif version != job.version + 1 and job.last_seq < self.archived_upto:
            # the versions between may be events retention dropped after archiving them
            # (the archived set is bounded by xid as well as seq, so it need not be a prefix
            # of each job's chain): start this job afresh, as at the window's start
            self._forget(job_id, job)
        else:
            if version != job.version + 1 or frm != job.state:
                self.fail(
                    "chain_continuous",
                    f"version {job.version} ({job.state}) followed by version "
                    f"{version} ({name} from {frm})",
                    [job_id],
                    [job.last_seq, seq],
                )
            self._attempt(job_id, job, seq, name, to, attempt)
        if group_key is not None:
            job.group_key = group_key
        if name == "claimed" or frm == "RUNNING" or frm == "SUSPENDED":
            self._attempts(job_id, job, seq, name, frm, to, attempt, at, worker, started_at)
        if job.group_key is not None:
            self._group_order(job_id, job, seq, name, to, at, (priority, submit_seq))
        if fair_tag is not None:
            self._fair_virtual_time(job_id, queue, seq, xid, fair_tag, fair_vtime)
        if name == "submitted":
            job.submitted_seq = seq
            if limit_keys is not None:
                job.limit_keys = tuple(limit_keys)
            if schedule is not None and tick is not None:
                self.ticks[(schedule, tick)].append((job_id, seq))
        if (
            to == "PENDING"
            and name in ("submitted", "dependencies_met")
            and job.released_seq is None
        ):
            job.released_seq, job.released_xid = seq, xid
        if name == "awaiting_children":
            # it waits for new dependencies, its children: it is released again when they end
            # (dependencies_met), or at once when none is left
            job.released_seq, job.released_xid = (seq, xid) if to == "PENDING" else (None, None)
        if name == "snoozed" and to == "PENDING":
            job.snoozes += 1
        if name in ("completed", "cancelled") and job.ended_seq is None:
            job.ended_seq, job.ended_state, job.ended_xid = seq, to, xid
        job.version, job.state, job.attempt, job.last_seq = version, to, attempt, seq

    def _group_order(
        self,
        job_id: str,
        job: _Job,
        seq: int,
        name: str,
        to: str,
        at: float,
        place: tuple[int, int],
    ) -> None:
        """group_order, and the group's PENDING jobs it keeps. A WAITING job is not PENDING:
        the later jobs of its group overtake it until its dependencies end. `place` is the
        job's (priority, submit_seq)."""
        assert job.group_key is not None
        pending = self.group_pending[(job.queue, job.group_key)]
        if name == "claimed":
            ahead = [
                (other, since_seq)
                for other, (other_place, since, since_seq) in pending.items()
                if other != job_id and other_place < place and since <= at - _GROUP_ORDER_MARGIN_S
            ]
            if ahead:
                self.fail(
                    "group_order",
                    f"claimed in group {job.group_key!r} of queue {job.queue!r} while "
                    f"{len(ahead)} job(s) before it were PENDING",
                    [job_id, *(other for other, _ in ahead)],
                    [seq, *(since_seq for _, since_seq in ahead)],
                )
        if to == "PENDING":
            if job_id not in pending:
                pending[job_id] = (place, at, seq)
        else:
            pending.pop(job_id, None)

    def _fair_virtual_time(
        self, job_id: str, queue: str, seq: int, xid: str, tag: float, vtime: float
    ) -> None:
        """fair_virtual_time, on a fair claim's `claimed` event. The queue's fair claims take
        turns under its fair_queues row lock, held to their commit, and take their events'
        seqs under it: in seq order each claim (one transaction) comes after every earlier
        one committed, reads the virtual time they advanced to the largest tag they served,
        and serves no job before that time (a start tag is max(virtual time, the key's
        finish)). A claim that chose without waiting for the turn reads a virtual time behind
        the tags already served; one that served a key ahead of it gave the key credit."""
        claim = self.fair_claim.get(queue)
        if claim is not None and claim[0] != xid:
            served = self.fair_served.get(queue)
            if served is None or claim[1] > served[0]:
                self.fair_served[queue] = (claim[1], claim[2])
            claim = None
        served = self.fair_served.get(queue)
        if served is not None and vtime < served[0]:
            self.fail(
                "fair_virtual_time",
                f"claimed in fair queue {queue!r} at virtual time {vtime:g}, behind the "
                f"start tag {served[0]:g} an earlier claim served",
                [job_id],
                [served[1], seq],
            )
        if tag < vtime:
            self.fail(
                "fair_virtual_time",
                f"claimed in fair queue {queue!r} at start tag {tag:g}, ahead of the virtual "
                f"time {vtime:g}",
                [job_id],
                [seq],
            )
        if claim is None or tag > claim[1]:
            self.fair_claim[queue] = (xid, tag, seq)

    def _forget(self, job_id: str, job: _Job) -> None:
        """What happened before a gap is unknown: no open attempt, nothing running."""
        job.claim = None
        job.cancel_requested_seq = None
        if job.group_key is not None:
            self.group_running[(job.queue, job.group_key)].discard(job_id)
            self.group_pending[(job.queue, job.group_key)].pop(job_id, None)

    def _attempt(self, job_id: str, job: _Job, seq: int, name: str, to: str, attempt: int) -> None:
        """attempts_counted: the attempt an event carries, given the one before it."""
        before = job.attempt
        expected = (
            before + 1
            if name == "claimed"
            else before - 1
            if name in _HANDED_BACK and to in _HANDED_BACK_TO
            else 0
            if name == "retried"
            else before
        )
        if attempt != expected:
            self.fail(
                "attempts_counted",
                f"{name} carries attempt {attempt}, expected {expected}",
                [job_id],
                [seq],
            )

    def _attempts(
        self,
        job_id: str,
        job: _Job,
        seq: int,
        name: str,
        frm: str | None,
        to: str,
        attempt: int,
        at: float,
        worker: str | None,
        started_at: float | None,
    ) -> None:
        """The open attempt: one_claim_per_attempt, cancel_honoured, group_exclusive. Only
        a claim and the events of a RUNNING or SUSPENDED job come here: no other moves it."""
        if name == "claimed":
            job.claim = _Claim(seq, attempt, started_at, worker)
            self.claims.append((job_id, seq, at))
            if job.group_key is not None:
                others = self.group_running[(job.queue, job.group_key)]
                if others:
                    self.fail(
                        "group_exclusive",
                        f"claimed in group {job.group_key!r} of queue {job.queue!r} while "
                        f"{len(others)} other job(s) of it ran",
                        [job_id, *sorted(others)],
                        [seq],
                    )
                others.add(job_id)
            return
        if frm == "SUSPENDED" and job.group_key is not None:
            # the suspended job kept its group's turn until now
            self.group_running[(job.queue, job.group_key)].discard(job_id)
        if frm != "RUNNING":
            return
        claim = job.claim
        if claim is not None:
            handed_back = name in _HANDED_BACK and to in _HANDED_BACK_TO
            if (
                attempt != claim.attempt - (1 if handed_back else 0)
                or started_at != claim.started_at
                or worker != claim.worker
            ):
                self.fail(
                    "one_claim_per_attempt",
                    f"{name} of attempt {attempt} (worker {worker!r}) does not "
                    f"match the claim of attempt {claim.attempt} (worker {claim.worker!r})",
                    [job_id],
                    [claim.seq, seq],
                )
        if name == "checkpointed":  # a step recorded: the attempt goes on
            return
        if name == "cancel_requested":
            job.cancel_requested_seq = seq
            return
        if job.cancel_requested_seq is not None and to not in ("CANCELLED", "COMPLETED"):
            self.fail(
                "cancel_honoured",
                f"the attempt ended {name} ({to}) after a cancel request",
                [job_id],
                [job.cancel_requested_seq, seq],
            )
        job.claim = None
        job.cancel_requested_seq = None
        if job.group_key is not None and to != "SUSPENDED":
            self.group_running[(job.queue, job.group_key)].discard(job_id)
        # a suspended job holds no limit slot: its attempt's claim ends here for the limits
        self.endings.append((job_id, seq))

    def result(self) -> list[CheckResult]:
        return list(self.results.values())


@dataclass(frozen=True)
class _Limit:
    key: str
    concurrency: int | None
    rate_limit: int | None
    rate_per_seconds: float | None


class _LimitHistory:
    """The limits in force at each instant, replayed from `flow_limit_changes` (migration
    0028; the real clock, `now()` of the changing transaction)."""

    def __init__(self, changes: list[asyncpg.Record]) -> None:
        self.times: list[float] = []
        self.configs: list[dict[str, _Limit]] = []
        self._ever_governed: dict[str, bool] = {}
        config: dict[str, _Limit] = {}
        for r in sorted(changes, key=lambda r: (r["changed_at"], r["seq"])):
            config = dict(config)
            if r["deleted"]:
                config.pop(r["key"], None)
            else:
                config[r["key"]] = _Limit(
                    r["key"], r["concurrency"], r["rate_limit"], r["rate_per_seconds"]
                )
            self.times.append(r["changed_at"].timestamp())
            self.configs.append(config)

    def __bool__(self) -> bool:
        return bool(self.times)

    def at(self, instant: float) -> dict[str, _Limit] | None:
        """The limits a claim begun at `instant` obeyed; None when a change was being made
        then (from a second before it began, as a claim's inner statements take newer
        snapshots, to _LIMIT_CHANGE_MARGIN_S after, as its commit comes later): that claim
        may have read either."""
        lo = bisect_left(self.times, instant - _LIMIT_CHANGE_MARGIN_S)
        if lo < len(self.times) and self.times[lo] <= instant + 1.0:
            return None
        index = bisect_left(self.times, instant) - 1
        return self.configs[index] if index >= 0 else {}

    def rate_lapsed(self, key: str, since: float, until: float) -> bool:
        """Whether a change in (since, until] left `key` without a rate for a while (its
        limit deleted, or the one governing it rate-less): no claim read its bucket then,
        and the sweeper may have removed it (evora.prune_flow_buckets()), so the rate that
        governs it again starts from a full bucket, as a new key's, however the limit
        compares with the one before."""
        first, end = bisect_right(self.times, since), bisect_right(self.times, until)
        for config in self.configs[first:end]:
            limit = _governing(config, key)
            if limit is None or limit.rate_limit is None or not limit.rate_per_seconds:
                return True
        return False

    def ever_governs(self, key: str) -> bool:
        """Whether a limit governed `key` at any time of the history: the claims of a key
        that none did (a queue's, mostly) can break no limit and are not replayed."""
        governed = self._ever_governed.get(key)
        if governed is None:
            governed = any(_governing(config, key) is not None for config in self.configs)
            self._ever_governed[key] = governed
        return governed


def _governing(limits: dict[str, _Limit], key: str) -> _Limit | None:
    """The limit of one concrete key: its own, else the longest prefix limit over it."""
    own = limits.get(key)
    if own is not None:
        return own
    prefixes = [
        lim for lim in limits.values() if lim.key.endswith("*") and key.startswith(lim.key[:-1])
    ]
    return max(prefixes, key=lambda lim: len(lim.key), default=None)


def _keys_held(job: _Job, row: asyncpg.Record | None) -> list[str]:
    """The limit keys a job's attempts hold: its queue's, and those its `submitted` event
    names, else (an event written before events named them, or a submission before the
    window) those of its row; a job retention removed whose submission is outside the window
    counts for its queue's key only."""
    own = job.limit_keys if job.limit_keys is not None else row["limit_keys"] if row else ()
    return [f"queue:{job.queue}", *own]


def _check_limits(
    auditor: _Auditor,
    history: _LimitHistory,
    rows: dict[str, asyncpg.Record],
    offset: float,
) -> None:
    """concurrency_limits and rate_limits, per concrete key, each claim against the limit in
    force when it began, each job holding the keys `_keys_held` says."""
    if not history:
        return
    keys_of: dict[str, list[str]] = {}
    for job_id, job in auditor.jobs.items():
        keys = [k for k in _keys_held(job, rows.get(job_id)) if history.ever_governs(k)]
        if keys:
            keys_of[job_id] = keys
    # every claim and ending of a job holding each key, in seq order (a seq is one event's)
    timeline: dict[str, list[tuple[int, int, str, float | None]]] = defaultdict(list)
    for job_id, seq, claimed_at in auditor.claims:
        for key in keys_of.get(job_id, ()):
            timeline[key].append((seq, 1, job_id, claimed_at))
    for job_id, seq in auditor.endings:
        for key in keys_of.get(job_id, ()):
            timeline[key].append((seq, -1, job_id, None))
    for key, moves in timeline.items():
        moves.sort()
        running: set[str] = set()
        # the bucket replayed while one rate governs the key, from full (a change to another
        # limit restarts it, and so does a spell without a rate: _LimitHistory.rate_lapsed)
        bucket: _Limit | None = None
        tokens = 0.0
        last = 0.0
        # the limits in force at the claim before, and the one of them governing the key:
        # claim after claim the same, so found once for them all
        governed_by: dict[str, _Limit] | None = None
        limit: _Limit | None = None
        for seq, delta, job_id, at in moves:
            if delta < 0:
                running.discard(job_id)
                continue
            running.add(job_id)
            assert at is not None
            # `at` is evora.clock_now(): back on the real clock of the limits' changes
            began = at - offset
            limits = history.at(began)
            if limits is None:
                bucket = None
                continue
            changed = limits is not governed_by
            if changed:
                limit, governed_by = _governing(limits, key), limits
            if limit is None:
                bucket = None
                continue
            if limit.concurrency is not None and len(running) > limit.concurrency:
                auditor.fail(
                    "concurrency_limits",
                    f"claim made {len(running)} jobs of {key!r} run (limit {limit.key!r}: "
                    f"{limit.concurrency})",
                    [job_id],
                    [seq],
                )
            if limit.rate_limit is None or not limit.rate_per_seconds:
                bucket = None
                continue
            rate = limit.rate_limit / limit.rate_per_seconds
            capacity = float(limit.rate_limit)
            if bucket != limit or (changed and history.rate_lapsed(key, last, began)):
                bucket, tokens, last = limit, capacity, began
            tokens = min(capacity, tokens + max(0.0, began - last) * rate) - 1
            last = max(last, began)
            if tokens < -(_RATE_SLACK_TOKENS + _RATE_SLACK_S * rate):
                auditor.fail(
                    "rate_limits",
                    f"claim of {key!r} beyond its bucket (limit {limit.key!r}: "
                    f"{limit.rate_limit} per {limit.rate_per_seconds} s; "
                    f"{-tokens:.2f} tokens over)",
                    [job_id],
                    [seq],
                )
                tokens = 0.0


async def audit(
    target: asyncpg.Connection | str,
    since: timedelta | None = None,
    *,
    from_seq: int | None = None,
    max_events: int | None = None,
) -> AuditReport:
    """Checks the history from `from_seq` (an earlier report's `to_seq + 1`), or of the
    last `since`, or all of it, on a connection (left as it was) or a DSN; at most
    `max_events` events (the sweeper's bounded pass: the next one goes on from `to_seq`)."""
    if isinstance(target, str):
        conn = await asyncpg.connect(target)
        try:
            return await _audit(conn, since, from_seq, max_events)
        finally:
            await conn.close()
    return await _audit(target, since, from_seq, max_events)


async def _audit(
    conn: asyncpg.Connection,
    since: timedelta | None,
    from_seq: int | None,
    max_events: int | None,
) -> AuditReport:
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        if from_seq is None:
            from_seq = (
                1
                if since is None
                else int(await conn.fetchval(_FIRST_SEQ_SINCE, since.total_seconds()))
            )
        auditor = _Auditor(int(await conn.fetchval(_ARCHIVED_UPTO)))
        last = from_seq - 1
        # A range of seq at a time (no index gives seq order: migration 0059); a range with
        # no event is a gap (dropped partitions, rolled back transactions), jumped over to
        # the next event there is, or the end.
        lo: int | None = from_seq
        while lo is not None and (max_events is None or auditor.events < max_events):
            hi = lo + _EVENTS_PER_RANGE
            left = None if max_events is None else max_events - auditor.events
            read = auditor.events
            await conn.execute(_EVENTS, lo, hi, left)
            while events := await conn.fetch(_NEXT_EVENTS):
                for e in events:
                    auditor.event(e)
                last = events[-1]["seq"]
            await conn.execute(_CLOSE_EVENTS)
            lo = hi if auditor.events > read else await conn.fetchval(_NEXT_SEQ, hi)
        # a pass cut short by max_events has not read the jobs' newest events
        complete = max_events is None or auditor.events < max_events
        if last < from_seq:
            # nothing in the window: still the tables' own check, and where to resume
            last = max(last, int(await conn.fetchval(_LAST_SEQ)))
        ids = list(auditor.jobs)
        rows = {r["id"]: r for r in await conn.fetch(_JOBS_OF, ids)}
        deps: dict[str, list[str]] = defaultdict(list)
        for r in await conn.fetch(_DEPENDENCIES_OF, ids):
            deps[r["job_id"]].append(r["depends_on"])
        missing = await conn.fetch(_WAITING_ON_MISSING)
        crowded = await conn.fetch(_OVER_MAX_PENDING, _LIMIT_CHANGE_MARGIN_S)
        mismatched = await conn.fetch(_SUSPENDED_MISMATCH)
        unwalked = await conn.fetch(_FAIR_BACKLOG_UNWALKED)
        overcounted = await conn.fetch(_FAIR_RUNNING_OVERCOUNTED)
        history = _LimitHistory(await conn.fetch(_LIMIT_CHANGES))
        pruned = {(r["queue"], r["state"]): r["pruned"] for r in await conn.fetch(_PRUNE_COUNTS)}
        offset = float(await conn.fetchval(_CLOCK_OFFSET))
    _check_tables(auditor, rows, pruned, complete)
    _check_dependencies(auditor, rows, deps)
    for r in missing:
        auditor.fail(
            "waiting_on_existing",
            f"WAITING on {r['depends_on']}, which no longer exists",
            [r["job_id"], r["depends_on"]],
            [],
        )
    for r in mismatched:
        auditor.fail(
            "suspended_on_its_callback",
            f"{r['problem']} (callback {r['callback']})",
            [r["job_id"]],
            [],
        )
    for r in crowded:
        auditor.fail(
            "max_pending_admitted",
            f"key {r['key']!r} holds {len(r['job_ids'])} jobs admitted since its limit last "
            f"changed, waiting to run, over its max_pending of {r['max_pending']}",
            r["job_ids"],
            [],
        )
    for r in unwalked:
        auditor.fail(
            "fair_backlog_walked",
            f"key {r['key']!r} of queue {r['queue']!r} has jobs waiting to run, but "
            + ("the queue is not fair" if r["unfair"] else "its claims no longer walk it"),
            r["job_ids"],
            [],
        )
    for r in overcounted:
        auditor.fail(
            "fair_running_counted",
            f"key {r['key']!r} of queue {r['queue']!r} is charged in advance for "
            f"{r['running']} attempts, with {r['running_jobs']} RUNNING and {r['unfolded']} "
            "endings not folded",
            r["job_ids"],
            [],
        )
    for (schedule, tick), made in auditor.ticks.items():
        if len({job_id for job_id, _ in made}) > 1:
            auditor.fail(
                "schedule_tick_once",
                f"schedule {schedule!r} tick {tick} made {len(made)} jobs",
                [job_id for job_id, _ in made],
                [seq for _, seq in made],
            )
    _check_limits(auditor, history, rows, offset)
    return AuditReport(from_seq, last, auditor.events, len(auditor.jobs), auditor.result())


def _check_tables(
    auditor: _Auditor,
    rows: dict[str, asyncpg.Record],
    pruned: dict[tuple[str, str], int],
    complete: bool,
) -> None:
    """ends_in_current_state, snoozes_counted and no_job_lost. A pass that stopped at
    max_events (not `complete`) has not read the newest events of some jobs: those are not
    compared."""
    gone: dict[tuple[str, str], list[str]] = defaultdict(list)
    for job_id, job in auditor.jobs.items():
        row = rows.get(job_id)
        if row is not None:
            if not complete and row["version"] > job.version:
                continue
            if (row["state"], row["version"]) != (job.state, job.version):
                auditor.fail(
                    "ends_in_current_state",
                    f"last event says {job.state} version {job.version}, the job is "
                    f"{row['state']} version {row['version']}",
                    [job_id],
                    [job.last_seq],
                )
            elif job.submitted_seq is not None and row["snoozes"] != job.snoozes:
                auditor.fail(
                    "snoozes_counted",
                    f"{job.snoozes} snoozed events, the job counts {row['snoozes']}",
                    [job_id],
                    [job.last_seq],
                )
            continue
        if job.submitted_seq is None:
            continue  # its submission is outside the window: nothing says it was admitted
        if job.state not in _FINISHED:
            auditor.fail("no_job_lost", f"gone while {job.state}", [job_id], [job.last_seq])
        else:
            gone[(job.queue, job.state)].append(job_id)
    for (queue, state), ids in gone.items():
        if len(ids) > pruned.get((queue, state), 0):
            auditor.fail(
                "no_job_lost",
                f"{len(ids)} {state} jobs of queue {queue!r} are gone, retention counted "
                f"{pruned.get((queue, state), 0)}",
                ids,
                [],
            )


def _check_dependencies(
    auditor: _Auditor,
    rows: dict[str, asyncpg.Record],
    deps: dict[str, list[str]],
) -> None:
    """dependencies_before_start: for each dependency whose submission is in the window."""
    for job_id, depends_on in deps.items():
        job = auditor.jobs[job_id]
        if job.released_seq is None:
            continue
        runs_anyway = rows[job_id]["on_dependency_failure"] == "run"
        for dep_id in depends_on:
            dep = auditor.jobs.get(dep_id)
            if dep is None or dep.submitted_seq is None:
                continue
            allowed = dep.ended_seq is not None and (dep.ended_state == "COMPLETED" or runs_anyway)
            # one statement may end a dependency and release its dependent (a settlement
            # that cancels a chain), writing their events in any order: the same transaction
            # is the same moment
            late = (
                dep.ended_seq is not None
                and dep.ended_seq > job.released_seq
                and dep.ended_xid != job.released_xid
            )
            if not allowed or late:
                auditor.fail(
                    "dependencies_before_start",
                    f"PENDING while its dependency {dep_id} was "
                    f"{'not finished' if dep.ended_seq is None else dep.ended_state}",
                    [job_id, dep_id],
                    [job.released_seq],
                )
