-- The outbox tail and the figures the projector derives from the tables themselves.

-- name: read_outbox
-- $1 after-xid (text), $2 after-seq, $3 limit. Events committed past a cursor, in (xid, seq)
-- order. Sequence numbers commit out of order, so `seq > last` alone would lose events: only
-- transactions older than every still-running one are read, so nothing that commits later can
-- land behind the cursor.
-- Only what the read models use, in the field order of `OutboxEvent`: of the job's image its
-- two timestamps, of the event's data its error (an empty object when present but null) and
-- reason; text rather than uuid and enum values, so decoding a row builds no objects.
SELECT xid::text::int8 AS xid, seq, job_id::text AS job_id, queue, type, event,
       from_state::text AS from_state, to_state::text AS to_state, worker_id, at,
       (job).run_at AS run_at, (job).started_at AS started_at,
       CASE WHEN data ? 'error'
            THEN coalesce(nullif(data -> 'error', 'null'::jsonb), '{}'::jsonb) END AS error,
       data ->> 'reason' AS reason
FROM job_events
WHERE (xid, seq) > ($1::text::xid8, $2::int8)
  AND xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY xid, seq
LIMIT $3;

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
