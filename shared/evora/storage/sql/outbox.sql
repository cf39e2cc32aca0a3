-- The outbox tail and the figures the projector derives from the tables themselves.

-- name: read_batch
-- $1 after-xid (text), $2 after-seq, $3 limit, $4 upto-xid (text; NULL: the limit and the
-- span end the batch), $5 upto-seq, $6 documents already past the start, as
-- {"queues": {queue: [xid, seq]}, "workers": {worker: [xid, seq]}}: only their later events
-- count for them, $7 seconds per time bucket, $8 the span's target snapshot (text; NULL:
-- the current snapshot, returned as `target`); the checkpoint's snapshot (every event
-- visible in it is consumed) taken apart by the caller: $9 its running transactions
-- (text[]), $10, $11 where the scan past its xmax starts: ($1, $2), or (its xmax, -1) if
-- that is later. As plain values the planner estimates the scans by them, and reads the
-- index in order up to the limit rather than the whole span into a sort.
-- One batch of the outbox, summed up for the read models in one row of JSON (all NULL when
-- nothing is new): `groups`, its events grouped by everything the read models count (queue,
-- worker, event, transition, time bucket, a dead-lettering by lease expiry; whether the
-- event counts for its queue's and its worker's documents), each with its count, latency
-- sums, first and last event; `samples`, per queue the latency samples in event order;
-- `runs`, per worker the jobs that started running under it and were still running at the
-- batch's end, and those that stopped and were running at its start; `failures`, the events
-- that report an error, one by one (reasons are grouped by a normalised message only the
-- projector knows); `history`, whose snapshots these are (even when nothing is new).
-- Sequence numbers commit out of order, so `seq > last` alone would lose events. The batch is
-- taken from a span, PgQ's way: the events of transactions visible in the target snapshot
-- and not in the checkpoint's (so committed in between), after ($1, $2) in (xid, seq) order.
-- A span is a fixed set however late it is read again, and a transaction still open at the
-- target lands in a later span when it commits: nothing waits for it, nothing is lost.
-- Not visible in the checkpoint's snapshot is "xid in its xip list, or at or past its xmax":
-- two index scans of each table's tail index, each in (xid, seq) order, neither reading the events
-- below its xmax that it already saw (a long transaction keeps its xmin low, not its xmax).
WITH span AS MATERIALIZED (
    SELECT coalesce($8::text::pg_snapshot, pg_current_snapshot()) AS target
),
picked AS MATERIALIZED (
    -- the events themselves (`ev`, the whole row), read as the scans find them: fetching them
    -- again afterwards by (xid, seq) would probe the tail index of every partition per event
    -- (seq has only a BRIN index, migration 0059). Each scan twice, once per table of the
    -- outbox (migration 0064): a batch by its (xid, last_seq), so that one holding events
    -- past ($1, $2) or ($10, $11) is found, and of its events those past them are kept; a
    -- batch whose first seq is past ($4, $5) holds no event up to it. A transaction's rows and
    -- batches hold disjoint ranges of seq, so (xid, last_seq) orders its batches as their
    -- events' (xid, seq) do.
    SELECT p.xid, p.seq, p.ev FROM (
        (SELECT e.xid, e.seq, e AS ev FROM evora.job_event_rows e
         WHERE e.xid = ANY ($9::text[]::xid8[])
           AND (e.xid, e.seq) > ($1::text::xid8, $2::int8)
           AND ($4::text IS NULL OR (e.xid, e.seq) <= ($4::text::xid8, $5::int8))
           AND pg_visible_in_snapshot(e.xid, (SELECT target FROM span))
         ORDER BY e.xid, e.seq
         LIMIT $3)
        UNION ALL
        (SELECT e.xid, e.seq, e AS ev FROM evora.job_event_rows e
         WHERE (e.xid, e.seq) > ($10::text::xid8, $11::int8)
           AND e.xid < (SELECT pg_snapshot_xmax(target) FROM span)
           AND ($4::text IS NULL OR (e.xid, e.seq) <= ($4::text::xid8, $5::int8))
           AND pg_visible_in_snapshot(e.xid, (SELECT target FROM span))
         ORDER BY e.xid, e.seq
         LIMIT $3)
        UNION ALL
        (SELECT v.xid, v.seq, v AS ev
         FROM evora.event_batches b CROSS JOIN LATERAL evora.batch_events(b) v
         WHERE b.xid = ANY ($9::text[]::xid8[])
           AND (b.xid, b.last_seq) > ($1::text::xid8, $2::int8)
           AND ($4::text IS NULL OR (b.xid <= $4::text::xid8
                                     AND (b.xid, b.seq) <= ($4::text::xid8, $5::int8)))
           AND pg_visible_in_snapshot(b.xid, (SELECT target FROM span))
           AND (v.xid, v.seq) > ($1::text::xid8, $2::int8)
           AND ($4::text IS NULL OR (v.xid, v.seq) <= ($4::text::xid8, $5::int8))
         ORDER BY b.xid, b.last_seq, v.seq
         LIMIT $3)
        UNION ALL
        (SELECT v.xid, v.seq, v AS ev
         FROM evora.event_batches b CROSS JOIN LATERAL evora.batch_events(b) v
         WHERE (b.xid, b.last_seq) > ($10::text::xid8, $11::int8)
           AND b.xid < (SELECT pg_snapshot_xmax(target) FROM span)
           AND ($4::text IS NULL OR (b.xid <= $4::text::xid8
                                     AND (b.xid, b.seq) <= ($4::text::xid8, $5::int8)))
           AND pg_visible_in_snapshot(b.xid, (SELECT target FROM span))
           AND (v.xid, v.seq) > ($10::text::xid8, $11::int8)
           AND ($4::text IS NULL OR (v.xid, v.seq) <= ($4::text::xid8, $5::int8))
         ORDER BY b.xid, b.last_seq, v.seq
         LIMIT $3)
    ) p
    ORDER BY p.xid, p.seq
    LIMIT $3
),
batch AS MATERIALIZED (
    -- numbered after the limit, so that only the batch's rows are sorted (a top-N sort)
    SELECT b.xid, b.seq, row_number() OVER (ORDER BY b.xid, b.seq) AS n, b.queue, b.type,
           b.worker_id, b.event, b.from_state, b.to_state, b.at, b.job_id, b.error,
           CASE WHEN b.event = 'claimed' AND b.run_at IS NOT NULL
                THEN greatest(date_part('epoch', b.at - b.run_at) * 1000, 0) END AS wait_ms,
           CASE WHEN b.event = 'completed' AND b.started_at IS NOT NULL
                THEN greatest(date_part('epoch', b.at - b.started_at) * 1000, 0) END AS run_ms,
           floor(date_part('epoch', b.at) / $7::int)::int8 AS bucket,
           b.event = 'dead_lettered' AND b.reason IS NOT DISTINCT FROM 'lease_expired'
               AS lease_expiry,
           coalesce((b.xid, b.seq) > ((b.queue_past ->> 0)::xid8, (b.queue_past ->> 1)::int8),
                    true) AS for_queue,
           b.worker_id IS NOT NULL
               AND coalesce((b.xid, b.seq) > ((b.worker_past ->> 0)::xid8,
                                               (b.worker_past ->> 1)::int8), true)
               AS for_worker
    FROM (
        SELECT e.xid, e.seq, e.queue, e.type, e.event, e.from_state::text AS from_state,
               e.to_state::text AS to_state, e.worker_id, e.at, e.job_id,
               (e.job).run_at AS run_at, (e.job).started_at AS started_at,
               e.data ->> 'reason' AS reason,
               -- an error reported as null is still a failure: an empty object
               CASE WHEN e.data ? 'error'
                    THEN coalesce(nullif(e.data -> 'error', 'null'::jsonb), '{}'::jsonb)
               END AS error,
               $6::jsonb -> 'queues' -> e.queue AS queue_past,
               $6::jsonb -> 'workers' -> e.worker_id AS worker_past
        FROM (SELECT (p.ev).* FROM picked p) e
    ) b
),
groups AS (
    SELECT queue, worker_id, event, from_state, to_state, bucket, lease_expiry, for_queue,
           for_worker, count(*) AS events,
           coalesce(sum(wait_ms), 0) AS wait_ms_sum, count(wait_ms) AS wait_n,
           coalesce(sum(run_ms), 0) AS run_ms_sum, count(run_ms) AS run_n,
           min(n) AS first, max(n) AS last, max(seq) AS max_seq
    FROM batch
    GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
),
-- per job whose running under a worker changed: when it last started and stopped, and when
-- it first stopped and started (running already at the batch's start: it stopped first)
moves AS (
    SELECT worker_id, job_id, max(n) FILTER (WHERE entering) AS last_in,
           max(n) FILTER (WHERE NOT entering) AS last_out,
           min(n) FILTER (WHERE entering) AS first_in,
           min(n) FILTER (WHERE NOT entering) AS first_out
    FROM (SELECT worker_id, job_id, n, to_state = 'RUNNING' AS entering FROM batch
          WHERE for_worker
            AND (to_state = 'RUNNING') <> coalesce(from_state = 'RUNNING', false)) m
    GROUP BY worker_id, job_id
),
runs AS (
    SELECT worker_id,
           jsonb_agg(job_id::text ORDER BY last_in)
               FILTER (WHERE last_in > coalesce(last_out, 0)) AS started,
           jsonb_agg(job_id::text ORDER BY first_out)
               FILTER (WHERE first_out < coalesce(first_in, last_out + 1)
                         AND last_out > coalesce(last_in, 0)) AS stopped
    FROM moves
    GROUP BY worker_id
)
SELECT (SELECT jsonb_agg(jsonb_build_array(
                   g.queue, g.worker_id, g.event, g.from_state, g.to_state, g.bucket,
                   g.lease_expiry, g.for_queue, g.for_worker, g.events, g.wait_ms_sum,
                   g.wait_n, g.run_ms_sum, g.run_n, g.first, g.last, g.max_seq,
                   l.xid::text::int8, l.seq, l.at, f.at))
        FROM groups g JOIN batch l ON l.n = g.last JOIN batch f ON f.n = g.first) AS groups,
       (SELECT jsonb_object_agg(queue, jsonb_build_array(waits, runs))
        FROM (SELECT queue,
                     coalesce(array_agg(wait_ms ORDER BY n) FILTER (WHERE wait_ms IS NOT NULL),
                              '{}') AS waits,
                     coalesce(array_agg(run_ms ORDER BY n) FILTER (WHERE run_ms IS NOT NULL),
                              '{}') AS runs
              FROM batch
              WHERE for_queue AND (wait_ms IS NOT NULL OR run_ms IS NOT NULL)
              GROUP BY queue) s) AS samples,
       (SELECT jsonb_object_agg(worker_id, jsonb_build_array(
                   coalesce(started, '[]'), coalesce(stopped, '[]')))
        FROM runs) AS runs,
       (SELECT jsonb_agg(jsonb_build_array(xid::text::int8, seq, job_id, queue, type, at, error)
               ORDER BY n)
        FROM batch WHERE error IS NOT NULL) AS failures,
       (SELECT target::text FROM span) AS target,
       -- the history the snapshots belong to, read by the same statement: the cluster's
       -- system identifier and the timeline it writes on (a promotion starts a new one). A
       -- stored target means nothing on another history (outbox.py, HistoryChanged). Both
       -- are readable by any role as PostgreSQL ships; the timeline is in the name of the WAL
       -- file being written, which a server in recovery refuses to tell: the outbox is read
       -- on a primary. Some servers refuse either function for good (a revoked privilege, a
       -- fork without it): the projector then reads with this column NULL instead
       -- (outbox.py, READ_BATCH_BLIND, which takes it for the statement's last).
       (pg_control_system()).system_identifier::text || '/'
           || left(pg_walfile_name(pg_current_wal_insert_lsn()), 8) AS history;

-- name: target_taken
-- $1 a span's new target, just returned by read_batch. Stored before the caller stores the
-- target anywhere else: this commit waits for the log to reach the disk (synchronous_commit
-- raised for it alone, should the server run with it off), and so puts on disk every commit
-- the target counts finished, a NOTIFY-only one (which does not wait) included. Without it
-- a crash could lose such a commit after the target was stored outside PostgreSQL, and
-- recovery hand its xid to a new transaction whose events that target never reads.
WITH durable AS (SELECT set_config('synchronous_commit', 'on', true))
INSERT INTO evora.outbox_target (only_row, target, taken_at)
SELECT true, $1::text::pg_snapshot, now() FROM durable
ON CONFLICT (only_row) DO UPDATE SET target = excluded.target, taken_at = excluded.taken_at;

-- name: backlog
-- $1 the checkpoint's snapshot (text), $2 its span's target (text, NULL: none yet), $3, $4
-- the (xid, seq) consumed up to in that span, $5 cap: committed events not yet consumed,
-- and the time of the oldest of them, for lag metrics. Every committed event counts, also
-- those of a span not read yet: the lag is measured against the truth, so it grows while
-- anything holds the read models back instead of reading 0. Not consumed: not visible in
-- $1 (in its xip list or at or past its xmax, as read_batch), and not in $2's span up to
-- ($3, $4) (without a target, only that position counts: a checkpoint from before spans).
WITH unread AS NOT MATERIALIZED (
    -- read_batch's index scans, without a target: every committed event past $1, of both
    -- tables (migration 0064), in the order of their tail indexes (a batch's events by the
    -- batch's (xid, last_seq), then their own seq)
    SELECT e.xid, e.seq, e.seq AS batch_seq, e.at,
           coalesce(pg_visible_in_snapshot(e.xid, $2::text::pg_snapshot), true)
               AND (e.xid, e.seq) <= ($3::text::xid8, $4::int8) AS consumed
    FROM evora.job_event_rows e
    UNION ALL
    SELECT v.xid, v.seq, b.last_seq, v.at,
           coalesce(pg_visible_in_snapshot(v.xid, $2::text::pg_snapshot), true)
               AND (v.xid, v.seq) <= ($3::text::xid8, $4::int8)
    FROM evora.event_batches b CROSS JOIN LATERAL evora.batch_events(b) v
)
SELECT count(*) AS events, min(at) AS oldest
FROM (
    (SELECT u.at FROM unread u
     WHERE u.xid = ANY (ARRAY(SELECT pg_snapshot_xip($1::text::pg_snapshot))) AND NOT u.consumed
     ORDER BY u.xid, u.batch_seq, u.seq
     LIMIT $5)
    UNION ALL
    (SELECT u.at FROM unread u
     WHERE u.xid >= pg_snapshot_xmax($1::text::pg_snapshot) AND NOT u.consumed
     ORDER BY u.xid, u.batch_seq, u.seq
     LIMIT $5)
    LIMIT $5
) AS behind;

-- name: oldest_due
-- $1 queues: when the longest-waiting claimable job of each became due (NULL: none due).
-- The first job by run_at of each priority (evora.pending_priorities()), one probe of
-- jobs_claimable each: the earliest of those that are due.
SELECT q.queue,
       (SELECT min(f.run_at)
        FROM evora.pending_priorities(ARRAY[q.queue]) AS p
        CROSS JOIN LATERAL (
            SELECT j.run_at FROM evora.jobs j
            WHERE j.state = 'PENDING' AND j.queue = p.queue AND j.priority = p.priority
            ORDER BY j.run_at
            LIMIT 1
        ) AS f
        WHERE f.run_at <= evora.clock_now()) AS oldest
FROM unnest($1::text[]) AS q(queue);

-- name: pruned
-- $1 queues: finished jobs the sweeper pruned, per queue and state (they leave without an
-- event).
SELECT queue, state::text AS state, pruned FROM evora.job_prune_counts WHERE queue = ANY($1::text[]);

-- name: in_recovery
-- Whether this server is a standby, asked only when read_batch could not read the history:
-- a standby refuses it for as long as it is one ("recovery is in progress"), and the outbox
-- must not be read there without it. A standby replays the primary's commits late, so a
-- span target taken on the primary counts finished transactions whose events it does not
-- hold yet: read there, they would be passed over for good.
SELECT pg_is_in_recovery();
