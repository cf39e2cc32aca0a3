-- The outbox tail and the figures the projector derives from the tables themselves.

-- name: read_batch
-- $1 after-xid (text), $2 after-seq, $3 limit, $4 upto-xid (text; NULL: the limit and the
-- horizon end the batch), $5 upto-seq, $6 documents already past the start, as
-- {"queues": {queue: [xid, seq]}, "workers": {worker: [xid, seq]}}: only their later events
-- count, $7 seconds per history minute, $8 seconds per completion bucket.
-- One batch of the outbox, folded into what the read models need: one row (none when caught
-- up) with where the batch ends, and as JSON per queue its net moves between states, event
-- totals, per-minute figures, completions per bucket and latency samples; per worker its
-- counters, queues and the jobs that began or stopped running under it; and the events that
-- report an error, one by one (failure reasons are grouped by normalised message, which
-- only the projector knows). Sequence numbers commit out of order, so `seq > last` alone
-- would lose events: only transactions older than every still-running one are read, so
-- nothing that commits later can land behind the cursor; with $4 the batch is the same
-- committed range again.
WITH batch AS MATERIALIZED (
    SELECT e.xid, e.seq, e.queue, e.type, e.event, e.from_state::text AS from_state,
           e.to_state::text AS to_state, e.worker_id, e.at, e.job_id::text AS job_id,
           e.data, row_number() OVER (ORDER BY e.xid, e.seq) AS n,
           CASE WHEN e.event = 'claimed' AND (e.job).run_at IS NOT NULL
                THEN greatest(extract(epoch FROM e.at - (e.job).run_at) * 1000, 0) END
               AS wait_ms,
           CASE WHEN e.event = 'completed' AND (e.job).started_at IS NOT NULL
                THEN greatest(extract(epoch FROM e.at - (e.job).started_at) * 1000, 0) END
               AS run_ms
    FROM job_events e
    WHERE (e.xid, e.seq) > ($1::text::xid8, $2::int8)
      AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
      AND ($4::text IS NULL OR (e.xid, e.seq) <= ($4::text::xid8, $5::int8))
    ORDER BY e.xid, e.seq
    LIMIT $3
),
queued AS (
    SELECT b.*, floor(extract(epoch FROM b.at) / $7::int)::int8 AS minute
    FROM batch b
    LEFT JOIN jsonb_each($6::jsonb -> 'queues') AS d(queue, cursor) ON d.queue = b.queue
    WHERE d.cursor IS NULL
       OR (b.xid, b.seq) > ((d.cursor ->> 0)::xid8, (d.cursor ->> 1)::int8)
),
per_minute AS (
    SELECT queue, minute, event, count(*) AS n, sum(wait_ms) AS wait_sum,
           count(wait_ms) AS wait_n, sum(run_ms) AS run_sum, count(run_ms) AS run_n
    FROM queued GROUP BY queue, minute, event
),
queue_minutes AS (
    SELECT queue, jsonb_object_agg(minute, fields) AS minutes
    FROM (
        SELECT queue, minute,
               jsonb_object_agg(event, n) || jsonb_build_object(
                   'wait_ms_sum', coalesce(sum(wait_sum), 0), 'wait_n', sum(wait_n),
                   'run_ms_sum', coalesce(sum(run_sum), 0), 'run_n', sum(run_n)) AS fields
        FROM per_minute GROUP BY queue, minute
    ) m
    GROUP BY queue
),
queue_totals AS (
    SELECT queue, jsonb_object_agg(event, n) AS totals
    FROM (SELECT queue, event, sum(n) AS n FROM per_minute GROUP BY queue, event) t
    GROUP BY queue
),
queue_moves AS (
    SELECT queue, jsonb_object_agg(state, delta) AS moved
    FROM (
        SELECT q.queue, m.state, sum(m.delta) AS delta
        FROM queued q, LATERAL (VALUES (q.from_state, -1), (q.to_state, 1)) AS m(state, delta)
        WHERE q.from_state IS DISTINCT FROM q.to_state AND m.state IS NOT NULL
        GROUP BY q.queue, m.state
    ) s
    GROUP BY queue
),
queue_buckets AS (
    SELECT queue, jsonb_object_agg(bucket, n) AS completed
    FROM (
        SELECT queue, floor(extract(epoch FROM at) / $8::int)::int8 AS bucket, count(*) AS n
        FROM queued WHERE event = 'completed' GROUP BY 1, 2
    ) c
    GROUP BY queue
),
queue_rows AS (
    SELECT g.queue, jsonb_build_object(
               'queue', g.queue, 'xid', l.xid::text::int8, 'seq', l.seq, 'at', l.at,
               'moved', coalesce(m.moved, '{}'), 'totals', t.totals, 'minutes', mi.minutes,
               'completed', coalesce(c.completed, '{}'),
               'waits', coalesce(g.waits, '{}'), 'runs', coalesce(g.runs, '{}')) AS row
    FROM (
        SELECT queue, max(n) AS last,
               array_agg(wait_ms ORDER BY n) FILTER (WHERE wait_ms IS NOT NULL) AS waits,
               array_agg(run_ms ORDER BY n) FILTER (WHERE run_ms IS NOT NULL) AS runs
        FROM queued GROUP BY queue
    ) g
    JOIN batch l ON l.n = g.last
    JOIN queue_totals t ON t.queue = g.queue
    JOIN queue_minutes mi ON mi.queue = g.queue
    LEFT JOIN queue_moves m ON m.queue = g.queue
    LEFT JOIN queue_buckets c ON c.queue = g.queue
),
worked AS (
    SELECT b.*
    FROM batch b
    LEFT JOIN jsonb_each($6::jsonb -> 'workers') AS d(worker, cursor) ON d.worker = b.worker_id
    WHERE b.worker_id IS NOT NULL
      AND (d.cursor IS NULL
           OR (b.xid, b.seq) > ((d.cursor ->> 0)::xid8, (d.cursor ->> 1)::int8))
),
-- per job whose running under the worker changed: running before the batch, and after it
runs AS (
    SELECT worker_id, job_id, max(n) AS last,
           (array_agg(from_state = 'RUNNING' ORDER BY n))[1] AS before,
           (array_agg(to_state = 'RUNNING' ORDER BY n DESC))[1] AS after
    FROM worked
    WHERE (to_state = 'RUNNING') <> coalesce(from_state = 'RUNNING', false)
    GROUP BY worker_id, job_id
),
worker_queues AS (
    SELECT worker_id, jsonb_agg(queue ORDER BY first) AS queues
    FROM (SELECT worker_id, queue, min(n) AS first FROM worked GROUP BY 1, 2) f
    GROUP BY worker_id
),
worker_runs AS (
    SELECT worker_id,
           coalesce(jsonb_agg(job_id ORDER BY last) FILTER (WHERE after), '[]') AS started,
           coalesce(jsonb_agg(job_id) FILTER (WHERE before AND NOT after), '[]') AS stopped
    FROM runs GROUP BY worker_id
),
-- what each worker counts: a dead-lettering by lease expiry is a lease expiry, not a failure
worker_rows AS (
    SELECT jsonb_build_object(
               'worker_id', g.worker_id, 'xid', l.xid::text::int8, 'seq', l.seq,
               'first_at', f.at, 'last_at', l.at, 'queues', q.queues,
               'started', coalesce(r.started, '[]'), 'stopped', coalesce(r.stopped, '[]'),
               'counts', jsonb_build_object(
                   'claimed', g.claimed, 'completed', g.completed, 'failed', g.failed,
                   'released', g.released, 'lease_expired', g.lease_expired)) AS row
    FROM (
        SELECT worker_id, min(n) AS first, max(n) AS last,
               count(*) FILTER (WHERE event = 'claimed') AS claimed,
               count(*) FILTER (WHERE event = 'completed') AS completed,
               count(*) FILTER (WHERE event = 'failed' OR (event = 'dead_lettered'
                   AND (data ->> 'reason') IS DISTINCT FROM 'lease_expired')) AS failed,
               count(*) FILTER (WHERE event = 'released') AS released,
               count(*) FILTER (WHERE event = 'lease_expired' OR (event = 'dead_lettered'
                   AND data ->> 'reason' = 'lease_expired')) AS lease_expired
        FROM worked GROUP BY worker_id
    ) g
    JOIN batch f ON f.n = g.first
    JOIN batch l ON l.n = g.last
    JOIN worker_queues q ON q.worker_id = g.worker_id
    LEFT JOIN worker_runs r ON r.worker_id = g.worker_id
)
SELECT l.xid::text::int8 AS xid, l.seq, l.at, l.n AS events,
       (SELECT max(seq) FROM batch) AS max_seq,
       (SELECT coalesce(jsonb_agg(row), '[]') FROM queue_rows) AS queues,
       (SELECT coalesce(jsonb_agg(row), '[]') FROM worker_rows) AS workers,
       -- an error reported as null is still a failure: an empty object
       (SELECT coalesce(jsonb_agg(jsonb_build_array(
                   xid::text::int8, seq, job_id, queue, type, at,
                   coalesce(nullif(data -> 'error', 'null'::jsonb), '{}'::jsonb))
               ORDER BY n), '[]')
        FROM batch WHERE data ? 'error') AS failures
FROM batch l
ORDER BY l.n DESC
LIMIT 1;

-- name: backlog
-- $1 after-xid (text), $2 after-seq, $3 cap: committed events past a cursor, and the time of
-- the oldest of them, for lag metrics.
SELECT count(*) AS events, min(at) AS oldest
FROM (
    SELECT at FROM job_events
    WHERE (xid, seq) > ($1::text::xid8, $2::int8)
      AND xid < pg_snapshot_xmin(pg_current_snapshot())
    ORDER BY xid, seq
    LIMIT $3
) AS behind;

-- name: oldest_due
-- $1 queues: when the longest-waiting claimable job of each became due (NULL: none due).
-- The first entry of the jobs_scheduled index per queue.
SELECT q.queue,
       (SELECT min(j.run_at) FROM jobs j
        WHERE j.state = 'PENDING' AND j.queue = q.queue AND j.run_at <= evora_now()) AS oldest
FROM unnest($1::text[]) AS q(queue);

-- name: pruned
-- $1 queues: finished jobs the sweeper pruned, per queue and state (they leave without an
-- event).
SELECT queue, state::text AS state, pruned FROM job_prune_counts WHERE queue = ANY($1::text[]);
