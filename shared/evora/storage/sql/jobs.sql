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
-- dispatcher's own clock cannot skew it), so a dispatcher can sleep exactly until then.
SELECT extract(epoch FROM min(n.run_at) - evora_now())::float8
FROM unnest($1::text[]) AS q(queue)
CROSS JOIN LATERAL (
    SELECT run_at FROM jobs
    WHERE state = 'PENDING' AND queue = q.queue AND run_at > evora_now()
    ORDER BY run_at
    LIMIT 1
) AS n;
