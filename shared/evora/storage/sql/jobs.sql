-- Reading jobs (submitting them: submit.sql).

-- name: get_job
-- $1 id.
SELECT * FROM evora.jobs WHERE id = $1;

-- name: listing_probe
-- $1 an id: the first job at or after it in the primary key's order, and its submit_seq. A
-- cursor of the release before migration 0068 (it paged by submission number) names a
-- submit_seq, and no index orders the jobs by it any more; ids and submit_seqs are both made
-- as jobs are submitted, so evora.storage.listing bisects the ids' milliseconds with this
-- probe (one primary key lookup each) for where the submit_seqs pass the cursor's.
SELECT id, submit_seq FROM evora.jobs WHERE id >= $1 ORDER BY id LIMIT 1;

-- name: listing_resumed
-- $1 a submit_seq from such a cursor, $2 and $3 the ids bounding the window around where the
-- probes found the submit_seqs pass it: the id of the newest job submitted before it, where
-- that listing would have gone on. Within the window, the job of the highest submit_seq below
-- $1; with none there, the newest job below the window. Both read the primary key in a range.
SELECT id
FROM ((SELECT id, true AS inside
       FROM evora.jobs
       WHERE id >= $2 AND id < $3 AND submit_seq < $1
       ORDER BY submit_seq DESC
       LIMIT 1)
      UNION ALL
      (SELECT id, false AS inside
       FROM evora.jobs
       WHERE id < $2
       ORDER BY id DESC
       LIMIT 1)) AS found
ORDER BY inside DESC
LIMIT 1;

-- name: job_events
-- $1 id: the job's events, oldest first (evora.events_of_job(): each table of the outbox
-- through its index by job).
SELECT seq, job_id, queue, type, event, from_state, to_state, attempt, worker_id, at, data
FROM evora.events_of_job($1) ORDER BY job_version;

-- name: next_due
-- $1 queues: seconds until the earliest future run_at (by the database's clock, so a
-- dispatcher's own clock cannot skew it), so a dispatcher can sleep exactly until then; or
-- until an empty token bucket (docs/flow-control.md) has a token again, if that is sooner:
-- jobs throttled by a rate limit become claimable then, and nothing else announces it.
-- A job due in the future was submitted before it is due (run_at > now >= created_at):
-- saying so lets the plan read jobs_delayed (migration 0053), one probe per queue.
SELECT extract(epoch FROM least(
    (SELECT min(n.run_at)
     FROM unnest($1::text[]) AS q(queue)
     CROSS JOIN LATERAL (
         SELECT run_at FROM evora.jobs
         WHERE state = 'PENDING' AND queue = q.queue AND run_at > created_at
           AND run_at > evora.clock_now()
         ORDER BY run_at
         LIMIT 1
     ) AS n),
    (SELECT min(r.refilled)
     FROM evora.flow_buckets b
     CROSS JOIN LATERAL evora.governing_limits(ARRAY[b.key]) AS g
     CROSS JOIN LATERAL (
         SELECT b.refilled_at + make_interval(
             secs => (1 - b.tokens) * g.rate_per_seconds / g.rate_limit) AS refilled
     ) AS r
     -- stored tokens only grow by a claim's refill: below 1 is where an empty bucket can be
     WHERE b.tokens < 1 AND g.rate_limit IS NOT NULL AND r.refilled > evora.clock_now())
) - evora.clock_now())::float8;

-- name: unclaimed_jobs
-- $1 seconds, $2 at most this many rows, $3 at most this many jobs looked at per queue: per
-- queue and type, the jobs a claim may take (evora.claimable() and the FIFO group rule
-- `group_turn` of rules.sql, as the claims do; tests/integration/test_claim_rule.py proves
-- the report counts what they take) that have been due for longer than $1 seconds and no
-- worker claimed, leaving out those whose limit has no room left, the most first (the
-- dispatcher's unclaimed-jobs warning). A job that waits for a reason (a paused queue, its
-- group's turn, a limit) is not unclaimed.
-- Bounded in the backlog: of each queue it looks at the first $3 jobs due for longer than $1
-- seconds in the order the claims take them (priority, run_at, submit_seq), read through
-- jobs_claimable a priority at a time, and `at_least` says the queue had more, so `pending`
-- counts the unclaimed among those looked at only. It reads at most $3 + 1 jobs per queue,
-- and a probe per priority present, however many are PENDING
-- (tests/integration/test_generic_plans.py).
WITH queues AS (
    SELECT p.queue FROM evora.pending_queues() AS p
),
full_keys AS (
    -- the limited keys without room left (docs/flow-control.md): jobs holding one wait for
    -- their limit, not for a worker, and are reported as throttled by the flow-control
    -- metrics instead. Only while any limit exists; read from the RUNNING jobs and from the
    -- buckets whose stored tokens are below one (refilling only adds), never per waiting job.
    SELECT g.key
    FROM evora.governing_limits(ARRAY(
        SELECT DISTINCT k FROM evora.jobs r, unnest(('queue:' || r.queue) || r.limit_keys) AS k
        WHERE r.state = 'RUNNING' AND EXISTS (SELECT 1 FROM evora.flow_limits)
        UNION
        SELECT b.key FROM evora.flow_buckets b WHERE b.tokens < 1
    )) AS g
    WHERE evora.running_holding(g.key) >= g.concurrency
       -- no tokens: an empty bucket, or one an upstream drains (evora.tokens() answers 0
       -- then even without a rate, NULL otherwise)
       OR (SELECT evora.tokens(b, g.rate_limit, g.rate_per_seconds, evora.clock_now())
           FROM evora.flow_buckets b WHERE b.key = g.key) < 1
),
looked_at AS (
    -- each queue's first $3 + 1 jobs due for longer than $1 seconds, in claim order: its
    -- priorities lowest first (a loose index scan), each one's jobs by run_at from the range
    -- of jobs_claimable, the walk stopping at $3 + 1; whether each is unclaimed, decided for
    -- those only
    SELECT q.queue, s.type, s.run_at, s.unclaimed,
           row_number() OVER (PARTITION BY q.queue
                              ORDER BY s.priority, s.run_at, s.submit_seq) AS n
    FROM queues q
    CROSS JOIN LATERAL (
        SELECT x.*
        FROM evora.pending_priorities(ARRAY[q.queue]) AS p
        CROSS JOIN LATERAL (
            SELECT j.type, j.priority, j.run_at, j.submit_seq,
                   -- the queue's pause checked once (q.queue: outside this subquery)
                   evora.claimable(j, q.queue, evora.clock_now(), NULL)
                   AND {{rule:group_turn}}
                   AND NOT ((('queue:' || j.queue) || j.limit_keys)
                            && ARRAY(SELECT key FROM full_keys)) AS unclaimed
            FROM evora.jobs j
            WHERE j.state = 'PENDING' AND j.queue = p.queue AND j.priority = p.priority
              AND j.run_at <= evora.clock_now() - make_interval(secs => $1)
            ORDER BY j.run_at, j.submit_seq
            LIMIT $3 + 1
        ) AS x
        LIMIT $3 + 1
    ) AS s
    WHERE q.queue IS NOT NULL
),
queue_totals AS (
    SELECT l.queue, count(*) > $3 AS at_least FROM looked_at l GROUP BY l.queue
)
SELECT l.queue, l.type, count(*) AS pending, min(l.run_at) AS oldest, t.at_least
FROM looked_at l JOIN queue_totals t ON t.queue = l.queue
WHERE l.unclaimed AND l.n <= $3
GROUP BY l.queue, l.type, t.at_least
ORDER BY count(*) DESC, l.queue, l.type
LIMIT $2;
