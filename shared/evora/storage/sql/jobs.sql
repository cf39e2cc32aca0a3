-- Submitting jobs and reading them.

-- name: submit
-- $1 ids, $2 queues, $3 types, $4 payloads, $5 priorities, $6 run_at (NULL: now + delay),
-- $7 delay seconds, $8 max_attempts, $9 lease_seconds, $10 backoff initial, $11 backoff max,
-- $12 backoff multiplier, $13 expires_at, $14 idempotency keys, $15 group keys,
-- $16 fingerprints, $17 suppressed queues (see transitions.sql).
-- Keyed items are inserted only if their key is new; ON CONFLICT waits for a concurrent
-- holder of the same key to commit, so exactly one of any racing submissions creates a job.
-- Every new job writes its `submitted` event.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::int2[],
                         $6::timestamptz[], $7::float8[], $8::int4[], $9::int4[],
                         $10::float8[], $11::float8[], $12::float8[], $13::timestamptz[],
                         $14::text[], $15::text[], $16::bytea[])
        WITH ORDINALITY AS i(id, queue, type, payload, priority, run_at, delay, max_attempts,
                             lease_seconds, backoff_initial, backoff_max, backoff_multiplier,
                             expires_at, idempotency_key, group_key, fingerprint, ord)
),
keyed AS (
    INSERT INTO idempotency_keys (queue, key, fingerprint, job_id)
    SELECT queue, idempotency_key, fingerprint, id FROM input
    WHERE idempotency_key IS NOT NULL
    -- one lock order for every batch, so racing batches cannot deadlock on their keys
    ORDER BY queue, idempotency_key
    ON CONFLICT (queue, key) DO NOTHING
    RETURNING job_id
),
moved AS (
    INSERT INTO jobs AS j (id, queue, type, payload, priority, run_at, max_attempts,
                           lease_seconds, backoff_initial, backoff_max, backoff_multiplier,
                           expires_at, idempotency_key, group_key)
    SELECT id, queue, type, payload, priority,
           coalesce(run_at, now() + make_interval(secs => delay)), max_attempts,
           lease_seconds, backoff_initial, backoff_max, backoff_multiplier,
           expires_at, idempotency_key, group_key
    FROM input
    WHERE idempotency_key IS NULL OR id IN (SELECT job_id FROM keyed)
    ORDER BY ord
    RETURNING j.*, j AS job, evora_job_image(j) AS image,
              'submitted' AS ev_name, NULL::job_state AS ev_from,
              NULL::text AS ev_worker, '{}'::jsonb AS ev_data
),
recorded AS (
    INSERT INTO job_events (job_id, job_version, queue, type, event, from_state, to_state,
                            attempt, worker_id, at, data, job)
    SELECT id, version, queue, type, ev_name, ev_from, state,
           attempt, ev_worker, updated_at, ev_data, image
    FROM moved
),
claimable AS (
    SELECT DISTINCT queue AS q FROM moved WHERE state = 'PENDING' OR group_key IS NOT NULL
),
notified AS (
    SELECT q, pg_notify('evora_jobs', q) AS sent
    FROM claimable
    WHERE q <> ALL($17::text[])
)
SELECT job,
       (SELECT array_agg(q) FROM notified) AS notified,
       (SELECT array_agg(q) FROM claimable WHERE q = ANY($17::text[])) AS owed
FROM moved;

-- name: idempotent_replays
-- $1 queues, $2 keys: the idempotency records (and their jobs, if not pruned) for replays.
SELECT k.queue AS key_queue, k.key AS key_name, k.fingerprint, k.job_id AS key_job_id, j.*
FROM unnest($1::text[], $2::text[]) AS x(queue, key)
JOIN idempotency_keys k ON k.queue = x.queue AND k.key = x.key
LEFT JOIN jobs j ON j.id = k.job_id;

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
