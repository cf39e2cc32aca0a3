-- Every change of a job's state is ONE statement: a CTE chain that picks rows under lock,
-- changes them guarded by their expected state (and lease token), and records exactly one
-- `job_events` row per changed job. A lost race matches no row and so writes no event.
-- Recording is evora.record_moves() (functions/claims_and_transitions.sql, where every
-- function named here lives; a claim and a completion write their events themselves and
-- leave the rest to evora.note_moves(), record_moves()' second half): the events, and the
-- NOTIFY hint for each
-- queue that gained a claimable job (a PENDING job, a group's next job, or room under a limit
-- that an ending attempt frees), except for the queues in the statement's last text[]
-- parameter, which this process notified a moment ago (evora/storage/notify.py); it reports
-- the queues notified (`notified`) and the ones left out (`owed`). Each changed job comes back
-- whole as `job` (a `jobs` row). The statements a worker sends with a lease token (heartbeat,
-- complete, fail, release) also answer for what they did not change: one row per item with
-- its `outcome`, 'done', 'lease_lost' (the job is not RUNNING under that token) or
-- 'not_found', so nobody has to look at the job again to tell a lost race from a bad id.
-- Time is `evora.clock_now()`, the database's clock, which tests may run ahead; every statement
-- here, the claim and submissions (functions/submissions.sql) read it.

-- name: claim
-- $1 queues, $2 types (NULL: any), $3 max jobs, $4 worker id.
-- Per queue, take the first claimable jobs in (priority, run_at, submission) order, skipping
-- rows other claimers hold. What is claimable is evora.claimable()'s rule
-- (functions/claims_and_transitions.sql) and the FIFO group rule `group_turn` (rules.sql,
-- which says why it is not a function), the two both claims and the unclaimed-jobs report
-- use (tests/integration/test_claim_rule.py).
-- `picked` holds the rows locked and re-checked as PENDING, so evora.claim_jobs() moves them
-- by id alone.
-- While any concurrency or rate limit exists, evora.claim_limited() (docs/flow-control.md) claims instead, enforcing the limits, with the
-- same rule; with none, the one cost is the EXISTS on flow_limits (empty, or holding only
-- max_pending limits, which the claim does not enforce: admission does), a one-time filter
-- of each branch. Both move their jobs with evora.claim_jobs(): the limited claim reads in statements of its own, under newer snapshots than this
-- one, and moves what it paid for right there; this one's picks are locked, and the
-- function's own snapshot shows their latest versions.
-- While a queue it names is under fair scheduling (a row in fair_queues: it has received a
-- job with a fairness key) and no concurrency or rate limit exists, evora.claim_fair()
-- (functions/fairness.sql) claims instead; unkeyed queues pay one probe of fair_queues'
-- primary key, a one-time filter like the flow_limits one.
-- A job whose group's head changed after this statement's snapshot (a job of its group
-- started meanwhile, and perhaps suspended since) fails the claim on jobs_group_running, unique
-- over a group's RUNNING and SUSPENDED jobs: the store runs it again (storage/jobs.py).
-- Each claimed job that has dependencies carries the results of those COMPLETED
-- (`dependency_results`, read by evora.claim_jobs() under its own snapshot, where the
-- dependency endings that released the job are visible whichever snapshot picked it).
WITH picked AS (
    SELECT c.id
    FROM unnest($1::text[]) AS q(queue)
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at, j.submit_seq
        FROM evora.jobs j
        WHERE evora.claimable(j, q.queue, evora.clock_now(), $2::text[])
          AND {{rule:group_turn}}
        ORDER BY j.priority, j.run_at, j.submit_seq
        LIMIT $3
        FOR UPDATE OF j SKIP LOCKED
    ) AS c
    WHERE NOT EXISTS (SELECT 1 FROM evora.flow_limits
                      WHERE concurrency IS NOT NULL OR rate_limit IS NOT NULL)
      AND NOT EXISTS (SELECT 1 FROM evora.fair_queues WHERE queue = ANY($1::text[]))
    ORDER BY c.priority, c.run_at, c.submit_seq
    LIMIT $3
)
SELECT m.job, m.dependency_results
FROM evora.claim_jobs(ARRAY(SELECT id FROM picked), NULL, $4::text, evora.clock_now()) AS m
UNION ALL
SELECT l.job, l.dependency_results
FROM evora.claim_limited($1::text[], $2::text[], $3::int4, $4::text) AS l
WHERE EXISTS (SELECT 1 FROM evora.flow_limits
              WHERE concurrency IS NOT NULL OR rate_limit IS NOT NULL)
UNION ALL
SELECT f.job, f.dependency_results
FROM evora.claim_fair($1::text[], $2::text[], $3::int4, $4::text) AS f
WHERE EXISTS (SELECT 1 FROM evora.fair_queues WHERE queue = ANY($1::text[]))
  AND NOT EXISTS (SELECT 1 FROM evora.flow_limits
                  WHERE concurrency IS NOT NULL OR rate_limit IS NOT NULL);

-- name: heartbeat
-- $1 id, $2 lease token, $3 lease seconds (NULL: the job's own), $4 progress (NULL: keep).
-- A heartbeat is not a transition: no version bump, no event. Exactly one row: the new
-- lease when it matched, else only the outcome.
-- `timeout_requested`: the attempt has run past the job's max_duration_seconds
-- (docs/jobs-that-wait.md), read off the row rather than marked by a sweep, so every
-- heartbeat from the deadline on says so. The lease is still extended: the worker needs it
-- to report the failure, and the sweeper's `time_out` ends the attempt after the grace
-- whatever the lease says.
-- The fence's state comes from a materialized CTE, as in evora.end_attempts(): a join
-- condition, not a filter that proves the partial indexes of RUNNING jobs usable. As a
-- filter, a plan made while few jobs ran read all of jobs_running_lease, every RUNNING job
-- of every queue, on each later heartbeat (tests/integration/test_plan_traps.py).
WITH fence AS MATERIALIZED (SELECT 'RUNNING'::evora.job_state AS state),
beat AS (
    UPDATE evora.jobs j
    SET lease_expires_at = evora.clock_now() + make_interval(secs => coalesce($3::int4, j.lease_seconds)),
        progress = coalesce($4::jsonb, j.progress)
    FROM fence f
    WHERE j.id = $1 AND j.lease_token = $2 AND j.state = f.state
    RETURNING j.lease_expires_at, j.cancel_requested,
              coalesce(j.started_at + make_interval(secs => j.max_duration_seconds)
                       <= evora.clock_now(), false) AS timeout_requested
)
SELECT CASE WHEN b.lease_expires_at IS NOT NULL THEN 'done'
            WHEN EXISTS (SELECT 1 FROM evora.jobs WHERE id = $1) THEN 'lease_lost'
            ELSE 'not_found' END AS outcome,
       b.lease_expires_at, b.cancel_requested, b.timeout_requested
FROM (VALUES (1)) AS one(x)
LEFT JOIN beat b ON true;

-- name: complete
-- $1 ids, $2 lease tokens, $3 results, $4 suppressed queues, $5 whether to return the jobs.
-- The rules are evora.complete_items()'s, which evora.complete() (a worker's completion in
-- its own transaction) runs too: one row per item, in order, 'done' (a repeat of a
-- completion under the same token too), 'lease_lost' or 'not_found'.
SELECT outcome, job, notified, owed
FROM evora.complete_items($1::uuid[], $2::uuid[], $3::jsonb[], $4::text[], $5::bool);

-- name: fail
-- $1 ids, $2 lease tokens, $3 errors ({message, type}), $4 retryable flags,
-- $5 retry-in seconds (NULL: the job's backoff), $6 the limit key of an upstream's
-- retry-after (NULL: none; then $5 is its seconds), $7 suppressed queues, $8 whether to return
-- the jobs. The rules are evora.fail_items()'s, which evora.fail() runs too: cancel wins,
-- then an upstream's retry-after, then the retry budget; one row per item like complete, a
-- repeat being 'lease_lost'.
SELECT outcome, job, notified, owed
FROM evora.fail_items($1::uuid[], $2::uuid[], $3::jsonb[], $4::bool[], $5::float8[],
                      $6::text[], $7::text[], $8::bool);

-- name: release
-- $1 id, $2 lease token, $3 delay seconds, $4 the event: 'released' (a worker hands the claim
-- back, e.g. at shutdown) or 'snoozed' (it asks to run again after the delay, counted in
-- `snoozes`; docs/jobs-that-wait.md), $5 suppressed queues.
-- Back to PENDING without counting the attempt, or CANCELLED when a cancel was requested (then
-- the attempt ran and stays counted). Exactly one row: the outcome, and the job if it moved.
-- The fence's state from a materialized CTE, as in `heartbeat` (the reason is there).
WITH fence AS MATERIALIZED (SELECT 'RUNNING'::evora.job_state AS state),
decided AS (
    SELECT ROW(
        j.id,
        CASE WHEN j.cancel_requested THEN 'CANCELLED' ELSE 'PENDING' END::evora.job_state,
        NULL,
        CASE WHEN j.cancel_requested THEN 'cancel_requested' END,
        $3::float8, true, $4::text, j.worker_id
    )::evora.attempt_end AS decision
    FROM evora.jobs j, fence f
    WHERE j.id = $1 AND j.lease_token = $2 AND j.state = f.state
    FOR UPDATE OF j
),
ended AS (
    SELECT * FROM evora.end_attempts(ARRAY(SELECT decision FROM decided), $5::text[])
)
SELECT CASE WHEN (e.job).id IS NOT NULL THEN 'done'
            WHEN EXISTS (SELECT 1 FROM evora.jobs WHERE id = $1) THEN 'lease_lost'
            ELSE 'not_found' END AS outcome,
       e.job, e.notified, e.owed
FROM (VALUES (1)) AS one(x)
LEFT JOIN ended e ON true;

-- name: expire_leases
-- $1 batch size, $2 suppressed queues. The sweeper: leases that ran out, decided like a failure
-- (cancel wins, then the retry budget). SKIP LOCKED and the re-checked `lease_expires_at <
-- evora.clock_now()` fence it against a heartbeat or completion that wins. The expiry is recorded as the
-- attempt's error (unless the job is being cancelled anyway), so a job dead-lettered this way
-- says why; one fixed message, so failure statistics count every expiry as one reason.
WITH decided AS (
    SELECT ROW(
        j.id,
        CASE WHEN j.cancel_requested THEN 'CANCELLED'
             WHEN j.attempt >= j.max_attempts THEN 'DLQ'
             ELSE 'PENDING' END::evora.job_state,
        CASE WHEN NOT j.cancel_requested THEN jsonb_build_object(
            'message', 'the lease expired before the worker reported an outcome',
            'type', 'lease_expired') END,
        CASE WHEN j.cancel_requested THEN 'cancel_requested'
             WHEN j.attempt >= j.max_attempts THEN 'lease_expired' END,
        evora.backoff_seconds(j.backoff_initial, j.backoff_max, j.backoff_multiplier,
                              j.attempt),
        false, 'lease_expired', j.worker_id
    )::evora.attempt_end AS decision
    FROM evora.jobs j
    WHERE j.state = 'RUNNING' AND j.lease_expires_at < evora.clock_now()
    ORDER BY j.lease_expires_at
    LIMIT $1
    FOR UPDATE OF j SKIP LOCKED
)
SELECT job, notified, owed
FROM evora.end_attempts(ARRAY(SELECT decision FROM decided), $2::text[]);

-- name: time_out
-- $1 batch size, $2 suppressed queues. The sweeper: attempts that ran past their job's
-- max_duration_seconds and then past the grace after it (the job's lease_seconds: time for a
-- worker told `timeout_requested` by a heartbeat to stop and report), heartbeats or not.
-- The lease is revoked and the attempt failed, decided like a failure (cancel wins, then the
-- retry budget: PENDING after its backoff, or the DLQ) with the error type and reason
-- `timeout`; one fixed message, so failure statistics count every timeout as one reason.
-- Fenced like expire_leases: SKIP LOCKED, and the locked row's newest version re-checked
-- (still RUNNING, still past the deadline of its current attempt): an outcome or a heartbeat
-- holding the row is skipped, and a completion that committed first wins. One that comes
-- after finds the attempt over (409).
WITH decided AS (
    SELECT ROW(
        j.id,
        CASE WHEN j.cancel_requested THEN 'CANCELLED'
             WHEN j.attempt >= j.max_attempts THEN 'DLQ'
             ELSE 'PENDING' END::evora.job_state,
        CASE WHEN NOT j.cancel_requested THEN jsonb_build_object(
            'message', 'the attempt ran past max_duration_seconds and did not stop within '
                       'the grace',
            'type', 'timeout') END,
        CASE WHEN j.cancel_requested THEN 'cancel_requested' ELSE 'timeout' END,
        evora.backoff_seconds(j.backoff_initial, j.backoff_max, j.backoff_multiplier,
                              j.attempt),
        false, 'failed', j.worker_id
    )::evora.attempt_end AS decision
    FROM evora.jobs j
    WHERE j.state = 'RUNNING' AND j.max_duration_seconds IS NOT NULL
      AND j.started_at + make_interval(secs => j.max_duration_seconds + j.lease_seconds)
          <= evora.clock_now()
    ORDER BY j.started_at
    LIMIT $1
    FOR UPDATE OF j SKIP LOCKED
)
SELECT job, notified, owed
FROM evora.end_attempts(ARRAY(SELECT decision FROM decided), $2::text[]);

-- name: expire_callbacks
-- $1 batch size, $2 suppressed queues. The sweeper: SUSPENDED jobs whose callback timed out,
-- each settled by its on_timeout (evora.expire_callbacks(), functions/callbacks.sql).
SELECT job, notified, owed FROM evora.expire_callbacks($1::integer, $2::text[]);

-- name: suspend
-- $1 id, $2 lease token, $3 timeout seconds, $4 on_timeout, $5 suppressed queues. A RUNNING
-- job suspends on a new callback (evora.suspend_job()). Exactly one row: the outcome, the job
-- if it moved and the callback id (NULL when a requested cancel won instead).
SELECT outcome, job, callback_secret, notified, owed
FROM evora.suspend_job($1::uuid, $2::uuid, $3::float8, $4::text, $5::text[]);

-- name: resolve_callback
-- $1 callback id (NULL: by job), $2 job id (an admin's resolution), $3 payload, $4 suppressed
-- queues. Exactly one row (evora.resolve_callback_item()).
SELECT outcome, resolution, job, notified, owed
FROM evora.resolve_callback_item($1::text, $2::uuid, $3::jsonb, $4::text[]);

-- name: expire_ttls
-- $1 batch size, $2 suppressed queues. The sweeper: PENDING jobs whose expires_at passed
-- before they started. A job that started and waits for a retry is past its TTL's reach.
WITH due AS (
    SELECT id FROM evora.jobs
    WHERE state = 'PENDING' AND expires_at IS NOT NULL AND started_at IS NULL
      AND expires_at <= evora.clock_now()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
moved AS (
    UPDATE evora.jobs j
    SET state = 'DLQ', finished_at = evora.clock_now(), updated_at = evora.clock_now(), version = j.version + 1
    FROM due WHERE j.id = due.id AND j.state = 'PENDING'
    RETURNING j.id, j AS job,
              ROW(j, 'dead_lettered', 'PENDING', NULL, '{"reason": "expired"}')::evora.move AS move
),
recorded AS (
    SELECT * FROM evora.record_moves(ARRAY(SELECT move FROM moved), $2::text[])
)
SELECT job,
       r.notified, r.owed
FROM moved CROSS JOIN recorded r;

-- name: cancel
-- $1 id, $2 suppressed queues. A PENDING, WAITING or SUSPENDED job is cancelled at once, with
-- the unfinished children its spawns made; a RUNNING job gets cancel_requested (once) and its
-- worker decides (evora.cancel_job(), evora.cancel_held()). Anything else is refused: a DLQ job
-- leaves the DLQ only by an admin's retry or discard. Exactly one row, like retry and discard:
-- the outcome ('done', 'refused' or 'not_found') and the job, moved or as it refused.
SELECT outcome, job, notified, owed FROM evora.cancel_job($1::uuid, $2::text[]);

-- name: leave_dlq
-- $1 id, $2 'PENDING' (an admin's retry) or 'CANCELLED' (a discard), $3 suppressed queues.
-- A DLQ job moves (evora.leave_dlq()); any other state is refused. One row
-- answered like cancel.
WITH target AS (SELECT id FROM evora.jobs WHERE id = $1 AND state = 'DLQ' FOR UPDATE),
moved AS (
    SELECT (l.job).id, l.job, l.notified, l.owed
    FROM evora.leave_dlq(ARRAY(SELECT id FROM target), $2::evora.job_state, $3::text[]) AS l
)
SELECT CASE WHEN m.id IS NOT NULL THEN 'done'
            WHEN cur.found THEN 'refused'
            ELSE 'not_found' END AS outcome,
       coalesce(m.job, cur.job) AS job,
       m.notified, m.owed
FROM (VALUES (1)) AS one(x)
LEFT JOIN moved m ON true
-- Refused: the job as its latest version shows it. The statement's snapshot may predate a
-- transaction that the target's row lock waited for and that moved the job out of reach; a
-- locking read waits for the same transaction and returns what it committed.
LEFT JOIN LATERAL (
    SELECT true AS found, c AS job FROM evora.jobs c WHERE c.id = $1 AND m.id IS NULL FOR SHARE
) cur ON true;

-- name: redrive
-- $1 queue, $2 type (NULL: any), $3 batch size, $4 suppressed queues. A bounded batch of the
-- queue's DLQ jobs back to PENDING, as an admin's retry does for one: the oldest first, by id
-- (a UUIDv7: jobs_listing_by_id reads them in order).
WITH target AS (
    SELECT id FROM evora.jobs
    WHERE queue = $1 AND state = 'DLQ' AND ($2::text IS NULL OR type = $2)
    ORDER BY id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
SELECT job, notified, owed
FROM evora.leave_dlq(ARRAY(SELECT id FROM target), 'PENDING', $4::text[]);

-- name: brief_lock_waits
-- A statement made for several independent requests (evora.coalesce), wrapped whole where
-- the text names it (queries.briefly): any lock it would wait for longer than this is held by
-- some other transaction, maybe an application's that stays open for long, and one request's
-- lock must not stall the others. The statement fails with lock_not_available (55P03)
-- instead, having changed nothing, and the coalescer splits the batch until the item that
-- needs the lock waits for it alone. Long enough that the row locks of concurrent statements
-- like it (held until their commits, a few milliseconds) are waited out rather than split
-- over.
-- The timeout is set by the statement itself, so that a lone request is one round trip, not
-- four (BEGIN, SET LOCAL, the statement, COMMIT): set_config(.., true) lasts until the end
-- of the transaction, which for a statement sent alone is the statement's own, and inside a
-- transaction (a traced submission's) covers the rest of it as SET LOCAL did. It must be in
-- force before the statement takes any lock: an uncorrelated scalar subquery is an InitPlan,
-- and a condition on it alone holds no column of any row, so the planner makes it a
-- One-Time Filter of a Result above the whole join tree (custom and generic plans alike),
-- checked before the first row is asked of anything below it; the wrapped statements take
-- no lock outside the functions they call below it (tests/integration/test_coalescing.py
-- holds a row and a key under either plan).
SELECT * FROM (
{{statement}}
) AS briefly
WHERE (SELECT set_config('lock_timeout', '100ms', true)) IS NOT NULL;
