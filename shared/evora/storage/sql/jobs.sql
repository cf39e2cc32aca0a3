-- Reading jobs (submitting them: submit.sql).

-- name: get_job
-- $1 id.
SELECT * FROM jobs WHERE id = $1;

-- name: job_events
-- $1 id: the job's events, oldest first.
SELECT seq, job_id, queue, type, event, from_state, to_state, attempt, worker_id, at, data
FROM job_events WHERE job_id = $1 ORDER BY job_version;

-- name: next_due
-- $1 queues: seconds until the earliest future run_at (by the database's clock, so a
-- dispatcher's own clock cannot skew it), so a dispatcher can sleep exactly until then; or
-- until an empty token bucket (docs/flow-control.md) has a token again, if that is sooner:
-- jobs throttled by a rate limit become claimable then, and nothing else announces it.
SELECT extract(epoch FROM least(
    (SELECT min(n.run_at)
     FROM unnest($1::text[]) AS q(queue)
     CROSS JOIN LATERAL (
         SELECT run_at FROM jobs
         WHERE state = 'PENDING' AND queue = q.queue AND run_at > evora_now()
         ORDER BY run_at
         LIMIT 1
     ) AS n),
    (SELECT min(r.refilled)
     FROM flow_buckets b
     CROSS JOIN LATERAL evora_governing_limits(ARRAY[b.key]) AS g
     CROSS JOIN LATERAL (
         SELECT b.refilled_at + make_interval(
             secs => (1 - b.tokens) * g.rate_per_seconds / g.rate_limit) AS refilled
     ) AS r
     -- stored tokens only grow by a claim's refill: below 1 is where an empty bucket can be
     WHERE b.tokens < 1 AND g.rate_limit IS NOT NULL AND r.refilled > evora_now())
) - evora_now())::float8;
