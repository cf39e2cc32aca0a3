"""The auditor (evora/storage/audit.py, docs/audit.md) on real PostgreSQL: a history made by
the system's own statements passes every check, and each check names the jobs and events of
a history broken on purpose. A broken history is made the way a defect would make it: a
statement that moves a job and records an event the state machine's writers never would
(`forge`), or a change of a row that records none. Those tests are marked `audit_skip`: the
teardown audit would (rightly) fail them."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from uuid import UUID

import asyncpg
import pytest

from evora.protocol.jobs import JobSubmission
from evora.protocol.states import JobState
from evora.storage import checkpoints
from evora.storage.audit import CHECKS, AuditReport, audit
from evora.storage.fairness import FairnessStore
from evora.storage.jobs import Failure, JobStore
from evora.storage.limits import LimitSpec, LimitStore, Rate
from evora.storage.retention import RetentionStore
from evora.storage.rows import JobDict
from tests.conftest import Clock, whole_event_images

broken = pytest.mark.audit_skip(reason="the test breaks the history to see the audit say so")


async def forge(
    pool: asyncpg.Pool, job_id: UUID, event: str, changes: str, data: object = None
) -> None:
    """Moves one job by `changes` (a SET list) and records `event` with `data` (JSON), as no
    real statement does: the defect the audit should see."""
    await pool.execute(
        f"""
        WITH m AS (
            UPDATE evora.jobs j SET {changes}, updated_at = evora.clock_now()
            FROM evora.jobs old WHERE old.id = j.id AND j.id = $1
            RETURNING ROW(j, $2::text, old.state, j.worker_id, $3::jsonb)::evora.move AS move
        )
        SELECT * FROM evora.record_moves(ARRAY(SELECT move FROM m), '{{}}')
        """,
        job_id,
        event,
        data or {},
    )


async def submitted(store: JobStore, count: int = 1, **fields: object) -> list[UUID]:
    outcomes = await store.submit_batch(
        [JobSubmission(queue="q", type="t", **fields) for _ in range(count)]  # type: ignore[arg-type]
    )
    return [o.id for o in outcomes]


async def claimed(store: JobStore, count: int = 1, worker: str = "w") -> list[JobDict]:
    jobs = await store.claim(worker_id=worker, queues=["q"], max_jobs=count)
    assert len(jobs) == count
    return jobs


def failing(report: AuditReport) -> dict[str, list[tuple[set[str], tuple[int, ...]]]]:
    return {
        c.name: [(set(v.job_ids), v.seqs) for v in c.violations] for c in report.checks if not c.ok
    }


async def audited(pool: asyncpg.Pool, **options: object) -> AuditReport:
    async with pool.acquire() as conn:
        return await audit(conn, **options)  # type: ignore[arg-type]


async def test_a_history_made_by_the_system_passes_every_check(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    head, second = await submitted(store, 2, max_attempts=2, group_key="g")
    [plain] = await submitted(store)
    dependent = (await store.submit(JobSubmission(queue="q", type="t", depends_on=[head]))).id

    async def claim(*expected: UUID) -> list[JobDict]:
        jobs = await store.claim(worker_id="w", queues=["q"], max_jobs=3)
        assert {j["id"] for j in jobs} == set(expected)
        return sorted(jobs, key=lambda j: expected.index(j["id"]))

    one, two = await claim(head, plain)
    await store.fail(Failure(head, one["lease_token"], "boom", retry_in_seconds=0))
    await store.complete(plain, two["lease_token"])
    [one] = await claim(head)
    await store.complete(head, one["lease_token"], {"ok": True})
    one, two = await claim(second, dependent)
    await store.release(second, one["lease_token"])
    await store.cancel(dependent)
    await store.fail(Failure(dependent, two["lease_token"], "late"))
    await RetentionStore(pool).prune_finished(JobState.COMPLETED, -1, 10)

    report = await audited(pool)
    assert report.ok, report.text()
    assert {c.name for c in report.checks} == set(CHECKS)
    assert report.jobs == 4 and report.events == 16
    # a window from later on: the same checks from each job's first event in it
    later = await audited(pool, from_seq=report.to_seq - 3)
    assert later.ok, later.text()
    assert later.events == 4 and later.from_seq == report.to_seq - 3
    assert (await audited(pool, since=timedelta(hours=1))).events == report.events


@broken
async def test_moves_outside_the_state_machine_and_gaps_in_a_chain(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    illegal, gap, silent = await submitted(store, 3)
    await forge(pool, illegal, "claimed", "version = j.version + 1")
    await forge(
        pool,
        gap,
        "cancelled",
        "state = 'CANCELLED', finished_at = evora.clock_now(), version = j.version + 2",
    )
    await pool.execute(
        "UPDATE evora.jobs SET state = 'CANCELLED', finished_at = now() WHERE id = $1", silent
    )

    found = failing(await audited(pool))
    assert {frozenset(j) for j, _ in found["transitions_legal"]} == {frozenset({str(illegal)})}
    # a claim that does not raise the attempt
    assert [j for j, _ in found["attempts_counted"]] == [{str(illegal)}]
    assert [j for j, _ in found["chain_continuous"]] == [{str(gap)}]
    assert [j for j, _ in found["ends_in_current_state"]] == [{str(silent)}]


@broken
async def test_an_ending_that_is_not_the_claims_attempt(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    [job_id] = await submitted(store)
    [job] = await claimed(store, worker="first")
    # what a stale token's change would look like: the attempt ends as another worker's
    await pool.execute("UPDATE evora.jobs SET worker_id = 'second' WHERE id = $1", job_id)
    await store.complete(job_id, job["lease_token"])

    found = failing(await audited(pool))
    assert list(found) == ["one_claim_per_attempt"]
    [(jobs, seqs)] = found["one_claim_per_attempt"]
    assert jobs == {str(job_id)} and len(seqs) == 2


@broken
async def test_an_ending_that_is_not_the_claims_attempt_across_an_upgrade(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """A claim recorded with the job's whole image (before the upgrade) and its ending with a
    narrow one (evora.event_image()): the attempt is compared across the two shapes, the
    group's order and exclusivity too, and only the forged ending fails."""
    async with whole_event_images(pool):
        head, second = await submitted(store, 2, group_key="g")
        [honest, forged] = await submitted(store, 2)
        jobs = {j["id"]: j for j in await claimed(store, 3, worker="first")}
    assert set(jobs) == {head, honest, forged}
    await pool.execute("UPDATE evora.jobs SET worker_id = 'second' WHERE id = $1", forged)
    for job_id in (head, honest, forged):
        await store.complete(job_id, jobs[job_id]["lease_token"])
    [job] = await claimed(store)
    assert job["id"] == second
    await store.complete(second, job["lease_token"])

    found = failing(await audited(pool))
    assert list(found) == ["one_claim_per_attempt"]
    [(job_ids, seqs)] = found["one_claim_per_attempt"]
    assert job_ids == {str(forged)} and len(seqs) == 2


@broken
async def test_snoozes_that_do_not_match_the_snoozed_events(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """A snooze is uncounted as an attempt and counted in `snoozes`: a job whose count
    disagrees with its `snoozed` events fails snoozes_counted, one that agrees passes."""
    honest, forged = await submitted(store, 2)
    for job in await claimed(store, 2):
        await store.snooze(job["id"], job["lease_token"], delay_seconds=1)
    await pool.execute("UPDATE evora.jobs SET snoozes = 3 WHERE id = $1", forged)

    found = failing(await audited(pool))
    assert list(found) == ["snoozes_counted"]
    assert [j for j, _ in found["snoozes_counted"]] == [{str(forged)}]
    assert (await store.get(honest))["snoozes"] == 1


@broken
async def test_two_running_jobs_of_one_group(store: JobStore, pool: asyncpg.Pool) -> None:
    head, second = await submitted(store, 2, group_key="g")
    await claimed(store)
    # the second leaves the group behind the claim's back, is claimed, and so runs beside
    # the head of the group its submission put it in
    await pool.execute("UPDATE evora.jobs SET group_key = NULL WHERE id = $1", second)
    await claimed(store)

    found = failing(await audited(pool))
    assert list(found) == ["group_exclusive"]
    assert [j for j, _ in found["group_exclusive"]] == [{str(head), str(second)}]


@broken
async def test_a_claim_beside_a_suspended_job_of_its_group(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """A suspended job keeps its group's turn: a job of the group claimed while it waits
    fails group_exclusive, as if both ran."""
    head, second = await submitted(store, 2, group_key="g")
    [job] = await claimed(store)
    await store.suspend(job["id"], job["lease_token"], timeout_seconds=60, on_timeout="fail")
    # the second leaves the group behind the claim's back and is claimed
    await pool.execute("UPDATE evora.jobs SET group_key = NULL WHERE id = $1", second)
    await claimed(store)

    found = failing(await audited(pool))
    assert list(found) == ["group_exclusive"]
    assert [j for j, _ in found["group_exclusive"]] == [{str(head), str(second)}]


@broken
async def test_suspended_jobs_without_their_callbacks(store: JobStore, pool: asyncpg.Pool) -> None:
    """A SUSPENDED job whose callback was settled behind its back, one holding a lease, and
    an open callback of a job that moved on each fail suspended_on_its_callback."""
    settled, leased, moved, honest = await submitted(store, 4)
    for job in await claimed(store, 4):
        await store.suspend(job["id"], job["lease_token"], timeout_seconds=60, on_timeout="fail")
    await pool.execute(
        "UPDATE evora.callbacks SET outcome = 'resolved', settled_at = now() WHERE job_id = $1",
        settled,
    )
    await pool.execute("UPDATE evora.jobs SET lease_expires_at = now() WHERE id = $1", leased)
    await forge(pool, moved, "resumed", "state = 'PENDING', attempt = 0, version = j.version + 1")

    found = failing(await audited(pool))
    assert list(found) == ["suspended_on_its_callback"]
    assert {next(iter(j)) for j, _ in found["suspended_on_its_callback"]} == {
        str(settled),
        str(leased),
        str(moved),
    }
    assert (await store.get(honest))["state"] == "SUSPENDED"


@broken
async def test_a_claim_that_overtakes_its_groups_head(
    store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    [head] = await submitted(store, group_key="g")
    # submitted before the second, WAITING for a job elsewhere: overtaking it is no violation
    elsewhere = (await store.submit(JobSubmission(queue="other", type="t"))).id
    waiting = (
        await store.submit(
            JobSubmission(queue="q", type="t", group_key="g", depends_on=[elsewhere])
        )
    ).id
    [second] = await submitted(store, group_key="g")
    # the head falls behind in its group without an event, so the claim takes the second
    # while the events still have the head first and PENDING, long enough to have been seen
    await pool.execute("UPDATE evora.jobs SET priority = 10 WHERE id = $1", head)
    await clock.advance(600)
    [job] = await claimed(store)
    assert job["id"] == second

    found = failing(await audited(pool))
    assert list(found) == ["group_order"]
    # the WAITING job, though submitted before the claimed one, is not overtaken wrongly:
    # it is not PENDING
    assert [j for j, _ in found["group_order"]] == [{str(second), str(head)}]
    assert str(waiting) not in found["group_order"][0][0]


@broken
async def test_claims_beyond_a_limit_in_force(store: JobStore, pool: asyncpg.Pool) -> None:
    ids = await submitted(store, 3)
    await claimed(store, 3)
    # limits recorded as older than the claims: every claim had to obey them
    await pool.execute(
        "INSERT INTO evora.flow_limits (key, concurrency, rate_limit, rate_per_seconds) "
        "VALUES ('queue:q', 2, 1, 3600)"
    )
    await pool.execute("UPDATE evora.flow_limit_changes SET changed_at = now() - interval '1 hour'")

    found = failing(await audited(pool))
    assert sorted(found) == ["concurrency_limits", "rate_limits"]
    assert [j for j, _ in found["concurrency_limits"]] == [{str(ids[2])}]
    # a bucket of 1 (and the slack for claims' own durations, 1 token) admits two at once
    assert [j for j, _ in found["rate_limits"]] == [{str(ids[2])}]


@broken
async def test_claims_beyond_a_limit_by_jobs_retention_removed(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """The keys an attempt held come from its job's `submitted` event: jobs that ran over a
    key's limit and were removed by retention afterwards are still judged by it."""
    ids = await submitted(store, 3, limit_keys=["k"])
    for job in await claimed(store, 3):
        await store.complete(job["id"], job["lease_token"])
    await RetentionStore(pool).prune_finished(JobState.COMPLETED, -1, 10)
    assert await pool.fetchval("SELECT count(*) FROM evora.jobs") == 0
    await pool.execute(
        "INSERT INTO evora.flow_limits (key, concurrency, rate_limit, rate_per_seconds) "
        "VALUES ('k', 2, 1, 3600)"
    )
    await pool.execute("UPDATE evora.flow_limit_changes SET changed_at = now() - interval '1 hour'")

    found = failing(await audited(pool))
    assert sorted(found) == ["concurrency_limits", "rate_limits"]
    [(jobs, _)] = found["concurrency_limits"]
    assert jobs == {str(ids[2])}
    assert [j for j, _ in found["rate_limits"]] == [{str(ids[2])}]


@broken
async def test_claims_beyond_a_limit_raised_after_them(store: JobStore, pool: asyncpg.Pool) -> None:
    """A limit changed during the run is judged as it was when each claim began, from its
    recorded changes: claims beyond it are reported though the limit is higher now (judging
    by the largest value the key ever had would pass them)."""
    ids = await submitted(store, 3, limit_keys=["k"])
    await claimed(store, 3)
    await pool.execute("INSERT INTO evora.flow_limits (key, concurrency) VALUES ('k', 2)")
    await pool.execute("UPDATE evora.flow_limit_changes SET changed_at = now() - interval '1 hour'")
    await pool.execute("UPDATE evora.flow_limits SET concurrency = 5 WHERE key = 'k'")
    await pool.execute(
        "UPDATE evora.flow_limit_changes SET changed_at = now() + interval '1 hour' "
        "WHERE concurrency = 5"
    )

    found = failing(await audited(pool))
    assert list(found) == ["concurrency_limits"]
    assert [j for j, _ in found["concurrency_limits"]] == [{str(ids[2])}]


async def test_claims_are_judged_by_the_limit_in_force_when_they_began(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    await pool.execute("INSERT INTO evora.flow_limits (key, concurrency) VALUES ('queue:q', 3)")
    await pool.execute("UPDATE evora.flow_limit_changes SET changed_at = now() - interval '1 hour'")
    await submitted(store, 3)
    await claimed(store, 3)
    # lowered, and a prefix limit that would govern the queue's key, after those claims
    await pool.execute("UPDATE evora.flow_limits SET concurrency = 1 WHERE key = 'queue:q'")
    await pool.execute("INSERT INTO evora.flow_limits (key, concurrency) VALUES ('queue:*', 1)")
    await pool.execute("DELETE FROM evora.flow_limits WHERE key = 'queue:q'")
    await pool.execute(
        "UPDATE evora.flow_limit_changes SET changed_at = now() + interval '1 hour' "
        "WHERE changed_at > now() - interval '1 minute'"
    )
    assert await pool.fetchval("SELECT count(*) FROM evora.flow_limit_changes") == 4

    report = await audited(pool)
    assert report.ok, report.text()


@broken
async def test_one_tick_that_made_two_jobs(pool: asyncpg.Pool) -> None:
    made = []
    for key in ("a", "b"):
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "SELECT set_config('evora.submitted_data', "
                """'{"schedule": "hourly", "tick": "2026-01-01T00:00:00Z"}', true)"""
            )
            made.append(
                await conn.fetchval(
                    "SELECT evora.submit('q', 't', '{}', jsonb_build_object('idempotency_key', "
                    "$1::text))",
                    key,
                )
            )

    found = failing(await audited(pool))
    assert list(found) == ["schedule_tick_once"]
    assert [j for j, _ in found["schedule_tick_once"]] == [{str(m) for m in made}]


@broken
async def test_a_dependent_released_before_its_dependency_ended(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    [parent] = await submitted(store)
    dependent = (await store.submit(JobSubmission(queue="q", type="t", depends_on=[parent]))).id
    await forge(
        pool,
        dependent,
        "dependencies_met",
        "state = 'PENDING', dependencies_left = 0, version = j.version + 1",
    )

    found = failing(await audited(pool))
    assert list(found) == ["dependencies_before_start"]
    assert [j for j, _ in found["dependencies_before_start"]] == [{str(dependent), str(parent)}]


@broken
async def test_an_attempt_that_went_back_to_pending_after_a_cancel_request(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    [job_id] = await submitted(store)
    await claimed(store)
    await store.cancel(job_id)
    await forge(
        pool,
        job_id,
        "failed",
        "state = 'PENDING', cancel_requested = false, "
        "lease_expires_at = NULL, version = j.version + 1",
    )

    found = failing(await audited(pool))
    assert list(found) == ["cancel_honoured"]
    [(jobs, seqs)] = found["cancel_honoured"]
    assert jobs == {str(job_id)} and len(seqs) == 2


@broken
async def test_jobs_gone_without_retention_and_a_dependent_left_waiting(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    pruned, deleted, parent = await submitted(store, 3, max_attempts=1)
    for job in await claimed(store, 3):
        if job["id"] == parent:
            await store.fail(Failure(parent, job["lease_token"], "no", retryable=False))
        else:
            await store.complete(job["id"], job["lease_token"])
    dependent = (await store.submit(JobSubmission(queue="q", type="t", depends_on=[parent]))).id
    await RetentionStore(pool).prune_finished(JobState.COMPLETED, -1, 1)
    # the other COMPLETED one, and the DLQ parent, deleted by no retention
    await pool.execute("DELETE FROM evora.jobs WHERE state IN ('COMPLETED', 'DLQ')")

    found = failing(await audited(pool))
    assert sorted(found) == ["no_job_lost", "waiting_on_existing"]
    # two COMPLETED jobs are gone and retention counted one: which one is not known
    assert {frozenset(j) for j, _ in found["no_job_lost"]} == {
        frozenset({str(pruned), str(deleted)}),
        frozenset({str(parent)}),
    }
    assert [j for j, _ in found["waiting_on_existing"]] == [{str(dependent), str(parent)}]


async def test_events_retention_dropped_from_the_middle_of_a_chain_are_no_gap(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """The archived rectangle is bounded by xid as well as seq (migration 0004): a job's
    middle events can be archived, and gone, while older ones stay. Retention removes whole
    partitions of job_events now (migration 0032); here the rows and batches are deleted past
    the append-only triggers (session_replication_role), inside the watermark."""
    [job_id] = await submitted(store, max_attempts=3)
    for _ in range(2):
        [job] = await claimed(store)
        await store.fail(Failure(job_id, job["lease_token"], "again", retry_in_seconds=0))
    seqs = [
        r["seq"]
        for r in await pool.fetch(
            "SELECT seq FROM evora.job_events WHERE job_id = $1 ORDER BY seq", job_id
        )
    ]
    middle = seqs[1:3]  # the first claim and its failure
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "UPDATE evora.event_archive_watermark SET upto_seq = $1, below_xid = '1000000000'",
            max(middle),
        )
        await conn.execute("SET LOCAL session_replication_role = replica")
        # (a claim's and a failure's events are statement batches, migration 0064; each of
        # these holds this one job's)
        for table in ("job_event_rows", "event_batches"):
            await conn.execute(f"DELETE FROM evora.{table} WHERE seq = ANY($1::int8[])", middle)

    report = await audited(pool)
    assert report.ok, report.text()
    assert report.events == len(seqs) - 2


async def test_a_settlement_that_cancels_a_dependency_and_releases_its_dependent_at_once(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """Cancelling the root cancels the middle job (it would not run without the root) and
    releases the last (it runs anyway) in one statement, which writes their events in any
    seq order: the same transaction is the same moment (seen in the random workload)."""
    for _ in range(3):
        [root] = await submitted(store)
        middle = (await store.submit(JobSubmission(queue="q", type="t", depends_on=[root]))).id
        last = (
            await store.submit(
                JobSubmission(queue="q", type="t", depends_on=[middle], on_dependency_failure="run")
            )
        ).id
        await store.cancel(root)
        states = await pool.fetch(
            "SELECT state::text FROM evora.jobs WHERE id = ANY($1::uuid[]) ORDER BY id",
            [middle, last],
        )
        assert sorted(r["state"] for r in states) == ["CANCELLED", "PENDING"]

    report = await audited(pool)
    assert report.ok, report.text()


@broken
async def test_max_pending_judges_the_jobs_admitted_since_the_limit_changed(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """Retries, and jobs from before a lowered max_pending, are allowed over it; jobs
    submitted since its last change are not. Admission itself cannot be made to fail here,
    so the change is moved back in time, as if those jobs had been admitted under it."""
    [retried] = await submitted(store, max_attempts=3)
    [job] = await claimed(store)
    await store.fail(Failure(retried, job["lease_token"], "again", retry_in_seconds=0))
    later = await submitted(store, 3)
    await pool.execute("INSERT INTO evora.flow_limits (key, max_pending) VALUES ('queue:q', 2)")
    # 4 waiting, lowered to 2: allowed, those jobs came before
    assert "max_pending_admitted" not in failing(await audited(pool))

    await pool.execute(
        "UPDATE evora.flow_limit_changes SET changed_at = changed_at - interval '1 hour'"
    )
    found = failing(await audited(pool))
    # the retried job ran, and was never refused: only the 3 never started count
    assert found["max_pending_admitted"] == [({str(j) for j in later}, ())]


async def test_checkpoints_and_timeouts_pass_every_check(
    store: JobStore, pool: asyncpg.Pool, clock: Clock
) -> None:
    """A checkpoint (RUNNING -> RUNNING) is a move of a running attempt, not its end: before
    and after a cancel request, the attempt's ending is still judged by its claim; a timeout
    is a failed attempt like any."""
    await submitted(store, 2, max_duration_seconds=10, lease_seconds=5, max_attempts=1)
    one, two = await claimed(store, 2)
    await checkpoints.record(pool, one["id"], one["lease_token"], "charged", {"charge": 1})
    await store.cancel(one["id"])
    await checkpoints.record(pool, one["id"], one["lease_token"], "shipped", None)
    assert (await store.release(one["id"], one["lease_token"]))["state"] == "CANCELLED"
    await checkpoints.record(pool, two["id"], two["lease_token"], "charged", 2)
    await clock.advance(15)
    assert [j["state"] for j in await store.time_out()] == ["DLQ"]

    report = await audited(pool)
    assert report.ok, report.text()
    assert report.events == 10


async def test_parents_waiting_for_their_children_pass_every_check(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """A job that waits for its children hands its attempt back (to WAITING, or PENDING when
    every child named had ended) and is released again by its children's endings, which come
    after its first release: neither is a violation."""
    await submitted(store, max_attempts=1)
    [parent] = await claimed(store)
    kids = [JobSubmission(queue="kids", type="c", idempotency_key=f"k{n}") for n in range(2)]
    await store.spawn_children(parent["id"], parent["lease_token"], kids)
    for child in await store.claim(worker_id="w", queues=["kids"], max_jobs=2):
        await store.complete(child["id"], child["lease_token"], "done")
    [parent] = await claimed(store)
    # the same children again, all ended: PENDING at once
    spawned = await store.spawn_children(parent["id"], parent["lease_token"], kids)
    assert spawned.job["state"] == "PENDING"
    [parent] = await claimed(store)
    await store.complete(parent["id"], parent["lease_token"])

    report = await audited(pool)
    assert report.ok, report.text()
    events = [e["event"] for e in await store.events(parent["id"])]
    assert events == [
        "submitted",
        "claimed",
        "awaiting_children",
        "dependencies_met",
        "claimed",
        "awaiting_children",
        "claimed",
        "completed",
    ]


async def _keyed(store: JobStore, key: str, count: int = 1) -> list[UUID]:
    return await submitted(store, count, fairness_key=key)


async def test_a_fair_queue_made_by_the_system_passes_the_fairness_checks(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """Keyed jobs submitted, claimed, completed, retried and submitted again after their
    key's backlog emptied: its state agrees with the jobs at every step."""
    await _keyed(store, "a", 2)
    await _keyed(store, "b")
    for _ in range(3):
        [job] = await claimed(store)
        await store.complete(job["id"], job["lease_token"])
        report = await audited(pool)
        assert report.ok, report.text()
    # the keys' backlogs are empty now and a claim found so; new work comes back through
    # the ledger
    assert await store.claim(worker_id="w", queues=["q"], max_jobs=1) == []
    await _keyed(store, "a")
    [job] = await claimed(store)
    report = await audited(pool)
    assert report.ok, report.text()
    assert {"fair_backlog_walked", "fair_running_counted"} <= {c.name for c in report.checks}


@broken
async def test_a_keyed_job_its_queues_claims_would_never_walk(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """A key marked without backlog while it has a PENDING job and no ledger row, and a
    keyed job in a queue that is not fair, fail fair_backlog_walked; a key marked without
    backlog whose new job is in the ledger does not."""
    [stranded] = await _keyed(store, "a")
    await _keyed(store, "b")
    [third] = await _keyed(store, "c")
    await pool.execute(
        "UPDATE evora.jobs SET run_at = now() + interval '1 hour' WHERE id <> $1", third
    )
    # the claim folds the ledger into the keys' rows (and takes the only due job)
    [job] = await claimed(store)
    assert job["id"] == third
    await pool.execute("UPDATE evora.fair_keys SET backlogged = false WHERE key IN ('a', 'b')")
    await _keyed(store, "b")  # noted in the ledger: the next claim walks the key again
    elsewhere = (await store.submit(JobSubmission(queue="other", type="t", fairness_key="d"))).id
    await pool.execute("DELETE FROM evora.fair_queues WHERE queue = 'other'")

    found = failing(await audited(pool))
    assert list(found) == ["fair_backlog_walked"]
    assert [j for j, _ in found["fair_backlog_walked"]] == [{str(elsewhere)}, {str(stranded)}]


@broken
async def test_an_ending_that_did_not_note_its_key(store: JobStore, pool: asyncpg.Pool) -> None:
    """A key charged in advance for more attempts than it has running or ended since the
    last fold (an ending whose ledger row is gone) fails fair_running_counted."""
    await _keyed(store, "a", 2)
    first, second = await claimed(store, 2)
    await store.complete(first["id"], first["lease_token"])
    assert "fair_running_counted" not in failing(await audited(pool))
    await pool.execute("DELETE FROM evora.fair_ledger")

    found = failing(await audited(pool))
    assert list(found) == ["fair_running_counted"]
    assert found["fair_running_counted"][0][0] == {str(second["id"])}


async def test_a_keyed_job_that_commits_after_a_claim_passed_its_key_over(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """The narrow window of fair_backlog_walked: a claim takes key `a` out of the walk (no
    job of it in its snapshot) while a submission of an `a` job is still open. The job
    commits with its ledger row, so the audit finds nothing wrong, and the next claim serves
    it."""
    await _keyed(store, "a")
    await _keyed(store, "b")
    ja, _ = await claimed(store, 2)
    await _keyed(store, "b")
    await claimed(store)  # b's second job: the queue's virtual time moves past a's finish
    await store.complete(ja["id"], ja["lease_token"])
    async with pool.acquire() as held:
        submission = held.transaction()
        await submission.start()
        late = await held.fetchval(
            "SELECT evora.submit('q', 't', '{}', '{\"fairness_key\": \"a\"}')"
        )
        # a claim that takes nothing folds a's ending and finds a without work
        assert await store.claim(worker_id="w", queues=["q"], types=["none"]) == []
        walked = "SELECT backlogged FROM evora.fair_keys WHERE queue = 'q' AND key = 'a'"
        assert await pool.fetchval(walked) is False
        await submission.commit()

    report = await audited(pool)
    assert report.ok, report.text()
    [job] = await claimed(store)
    assert job["id"] == late


async def test_concurrent_keyed_work_passes_the_fairness_checks(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """Submitters, claimers and workers of a fair queue at once, on their own connections,
    each audited in the middle of it and at the end: the checks find nothing."""
    stop = asyncio.Event()
    rng = random.Random(36)

    async def submitter() -> None:
        while not stop.is_set():
            await _keyed(store, f"t:{rng.randrange(6)}", rng.randint(1, 3))

    async def worker() -> None:
        while not stop.is_set():
            for job in await store.claim(worker_id="w", queues=["q"], max_jobs=3):
                match rng.randrange(3):
                    case 0:
                        await store.complete(job["id"], job["lease_token"])
                    case 1:
                        await store.release(job["id"], job["lease_token"])
                    case _:
                        await store.fail(Failure(job["id"], job["lease_token"], "x"))

    tasks = [asyncio.create_task(f()) for f in (submitter, submitter, worker, worker, worker)]
    for _ in range(5):
        await asyncio.sleep(0.4)
        report = await audited(pool)
        assert report.ok, report.text()
    stop.set()
    await asyncio.gather(*tasks)
    report = await audited(pool)
    assert report.ok, report.text()
    assert await pool.fetchval("SELECT sum(served) FROM evora.fair_keys") > 0


async def _fair_tags(pool: asyncpg.Pool) -> list[tuple[str, float, float]]:
    """The fairness key, start tag and virtual time of every tagged claim, in seq order."""
    rows = await pool.fetch(
        "SELECT j.fairness_key, (e.data -> 'fair' ->> 'tag')::float8 AS tag, "
        "(e.data -> 'fair' ->> 'vtime')::float8 AS vtime "
        "FROM evora.job_events e JOIN evora.jobs j ON j.id = e.job_id "
        "WHERE e.event = 'claimed' AND e.data ? 'fair' ORDER BY e.seq"
    )
    return [(r["fairness_key"], r["tag"], r["vtime"]) for r in rows]


@broken
async def test_fair_claims_that_run_virtual_time_back_or_serve_ahead_of_it(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """A fair claim's `claimed` events carry each job's start tag and the virtual time the
    claim read under its queue's lock. A claim that read the queue before an earlier claim
    committed (virtual time behind the tags already served), and one that served a job ahead
    of virtual time (its key credited for time it had no work), fail fair_virtual_time."""
    await _keyed(store, "a", 3)
    await _keyed(store, "b", 3)
    await claimed(store, 2)
    await claimed(store, 2)
    # each key's estimate starts at 1 s, its weight 1: two jobs at tag 0, then two at tag 1
    assert await _fair_tags(pool) == [("a", 0, 0), ("b", 0, 0), ("a", 1, 0), ("b", 1, 0)]
    stale, ahead = [
        r["id"]
        for r in await pool.fetch(
            "SELECT id FROM evora.jobs WHERE state = 'PENDING' ORDER BY fairness_key"
        )
    ]
    claim = (
        "state = 'RUNNING', attempt = j.attempt + 1, version = j.version + 1, worker_id = 'w', "
        "started_at = evora.clock_now(), lease_token = gen_random_uuid(), "
        "lease_expires_at = evora.clock_now() + interval '1 minute'"
    )
    await forge(pool, stale, "claimed", claim, {"fair": {"tag": 0, "vtime": 0}})
    await forge(pool, ahead, "claimed", claim, {"fair": {"tag": 1, "vtime": 3}})

    found = failing(await audited(pool))
    assert list(found) == ["fair_virtual_time"]
    assert [j for j, _ in found["fair_virtual_time"]] == [{str(stale)}, {str(ahead)}]


async def _claimers(store: JobStore, queue: str, claimers: int = 3) -> None:
    """`claimers` claimers of `queue` at once, each on its own connection, 15 claims of up
    to 2 jobs each, completing or releasing what they took."""
    rng = random.Random(36)

    async def claimer() -> None:
        for _ in range(15):
            for job in await store.claim(worker_id="w", queues=[queue], max_jobs=2):
                if rng.random() < 0.7:
                    await store.complete(job["id"], job["lease_token"])
                else:
                    await store.release(job["id"], job["lease_token"])

    await asyncio.gather(*(claimer() for _ in range(claimers)))


async def test_concurrent_fair_claimers_with_weights_pass_the_history_checks(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """Claimers of a fair queue whose keys have weights, on several connections at once,
    with attempts ending meanwhile: every claim is tagged, and virtual time never ran back."""
    weights = FairnessStore(pool)
    await weights.put("gold", 3)
    await weights.put("tier:*", 2)
    for key in ("gold", "tier:a", "tier:b", "plain"):
        await _keyed(store, key, 30)
    await _claimers(store, "q")

    report = await audited(pool)
    assert report.ok, report.text()
    tagged = await _fair_tags(pool)
    claims = await pool.fetchval("SELECT count(*) FROM evora.job_events WHERE event = 'claimed'")
    assert len(tagged) == claims > 30
    assert {key for key, _, _ in tagged} == {"gold", "tier:a", "tier:b", "plain"}


async def test_concurrent_claimers_under_a_limit_pass_the_history_checks(
    store: JobStore, pool: asyncpg.Pool
) -> None:
    """Claimers of jobs holding a key under a concurrency and a rate limit, on several
    connections at once, with attempts ending meanwhile: concurrency_limits and rate_limits
    judge every claim (the limit was in force long before) and find nothing."""
    await LimitStore(pool).put("k", LimitSpec(concurrency=3, rate=Rate(limit=20, per_seconds=1)))
    await pool.execute("UPDATE evora.flow_limit_changes SET changed_at = now() - interval '1 hour'")
    await store.submit_batch(
        [JobSubmission(queue="q", type="t", limit_keys=["k"]) for _ in range(60)]
    )
    await _claimers(store, "q")

    report = await audited(pool)
    assert report.ok, report.text()
    # more claims than the concurrency, and than the bucket holds: both limits were reached
    assert await pool.fetchval("SELECT count(*) FROM evora.job_events WHERE event = 'claimed'") > 20
