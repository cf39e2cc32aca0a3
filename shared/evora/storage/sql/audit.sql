-- The auditor (evora/storage/audit.py, docs/audit.md): what it reads of the event history and
-- the tables. It runs in one REPEATABLE READ, READ ONLY transaction, so the events and the
-- rows it compares them with are one consistent picture (an event is written in the same
-- transaction as the change it records). The checks themselves are done in Python over the
-- events streamed in seq order, keeping a few facts per job; nothing here writes.

-- name: first_seq_since
-- $1 seconds: the first event written at most that long ago by the database's clock
-- (`at` is the writing transaction's start), or one past the last event when none was.
-- The window's partitions only (`at` is their key), then the least seq of what they hold
-- past it: no index serves seq order (migration 0059), and the audit reads the window next.
-- Of each table of the outbox (migration 0064): a batch's seq is its least event's, so its
-- events need not be unfolded.
SELECT coalesce(
    least((SELECT min(e.seq) FROM evora.job_event_rows e
           WHERE e.at >= evora.clock_now() - make_interval(secs => $1::float8)),
          (SELECT min(b.seq) FROM evora.event_batches b
           WHERE b.at >= evora.clock_now() - make_interval(secs => $1::float8))),
    evora.last_event_seq() + 1);

-- name: last_seq
-- The newest event's seq (0 without events): where an incremental audit resumes.
SELECT evora.last_event_seq();

-- name: next_seq
-- $1 seq: the first event's seq at or past it (NULL: none), across a gap in the history.
SELECT evora.first_event_seq($1::int8);

-- name: clock_offset
-- How far `evora.clock_now()` runs ahead of `now()` right now, in seconds (tests move it).
SELECT extract(epoch FROM evora.clock_now() - now())::float8;

-- name: events
-- $1 from seq, $2 below this seq, $3 at most this many (NULL: all). The events of that range
-- of seq (evora.events_in_seq_range(): read whole through the BRIN index on seq, then
-- sorted; the auditor walks the history a range at a time, migration 0059), oldest first, with
-- the fields of the job image the checks use (never the payload, result or error). An event
-- after `submitted` carries only some (evora.event_image()): its worker is the event's own
-- column, which every transition writes as the job's worker; an event with a whole image
-- (written before) still has it in the image. A `submitted` event's data names the job's
-- limit keys where it has any (events written before that do not: the job's row says them);
-- a fair claim's `claimed` event, the job's start tag and the virtual time the claim read
-- (functions/fairness.sql).
-- The auditor takes the columns by position, in this order (audit.py, _Auditor.event), and
-- only compares ids and times: the job's id comes as text and the times as seconds since
-- the epoch (float8, exact to the microsecond), cheaper to decode than uuid and datetime
-- objects, and a text id kept for the window is nothing the garbage collector walks.
-- A cursor, which next_events reads 1,000 events at a time and close_events closes: a batch
-- is one round trip, checked at once (not a row per awaited step), and small enough that its
-- records die young in the auditor's process (a whole range's 10,000 fetched at once lived
-- long enough for Python's garbage collector to promote them, and its full collections came
-- sooner: docs/benchmarks/2026-11-29-auditor-cpu.md). Closed after its range: a finished
-- portal keeps its executor's memory (the range's sort, ~5 MB) to the transaction's end.
DECLARE evora_audit_events NO SCROLL CURSOR FOR
SELECT e.seq, e.xid::text AS xid, e.job_id::text AS job_id, e.job_version, e.queue, e.event,
       e.from_state::text AS from_state,
       e.to_state::text AS to_state, e.attempt, date_part('epoch', e.at) AS at,
       coalesce((e.job).worker_id, e.worker_id) AS worker_id,
       date_part('epoch', (e.job).started_at) AS started_at, (e.job).group_key AS group_key,
       (e.job).priority AS priority, (e.job).submit_seq AS submit_seq,
       e.data ->> 'schedule' AS schedule, e.data ->> 'tick' AS tick,
       CASE WHEN e.data ? 'limit_keys'
            THEN ARRAY(SELECT jsonb_array_elements_text(e.data -> 'limit_keys')) END
           AS limit_keys,
       (e.data -> 'fair' ->> 'tag')::float8 AS fair_tag,
       (e.data -> 'fair' ->> 'vtime')::float8 AS fair_vtime
FROM evora.events_in_seq_range($1::int8, $2::int8) e
ORDER BY e.seq
LIMIT $3::int8;

-- name: next_events
-- The next events of the `events` cursor (none: its range is read).
FETCH 1000 FROM evora_audit_events;

-- name: close_events
CLOSE evora_audit_events;

-- name: jobs_of
-- $1 job ids: those that still exist, with what the events do not carry (ids as text, as
-- the auditor keeps them).
SELECT j.id::text AS id, j.state::text AS state, j.version, j.limit_keys,
       j.on_dependency_failure, j.snoozes
FROM evora.jobs j
WHERE j.id = ANY($1::uuid[]);

-- name: dependencies_of
-- $1 job ids: the dependencies each of them was submitted with (ids as text).
SELECT d.job_id::text AS job_id, d.depends_on::text AS depends_on
FROM evora.job_dependencies d
WHERE d.job_id = ANY($1::uuid[]);

-- name: waiting_on_missing
-- Every WAITING job with a dependency that is not in `jobs`: a dependency leaves `jobs` only
-- by retention, after it finished, and a finished dependency has already settled its
-- dependents, so such a job waits for nothing that can ever happen.
SELECT d.job_id, d.depends_on
FROM evora.jobs w
JOIN evora.job_dependencies d ON d.job_id = w.id
WHERE w.state = 'WAITING'
  AND NOT EXISTS (SELECT 1 FROM evora.jobs p WHERE p.id = d.depends_on)
ORDER BY d.job_id, d.depends_on;

-- name: suspended_mismatch
-- Every SUSPENDED job that holds a lease or does not wait on exactly its own open callback
-- (jobs.callback names it), and every open callback whose job is not SUSPENDED on it: a
-- callback is settled in the statement that moves its job out of SUSPENDED
-- (functions/callbacks.sql, the cancel statement), so neither can happen.
SELECT coalesce(j.id, c.job_id) AS job_id, coalesce(c.id, (j.callback ->> 'id')::uuid) AS callback,
       CASE WHEN j.id IS NULL THEN 'an open callback of a job that is not SUSPENDED on it'
            WHEN c.id IS NULL THEN 'a SUSPENDED job without its open callback'
            ELSE 'a SUSPENDED job holding a lease' END AS problem
FROM (SELECT * FROM evora.jobs WHERE state = 'SUSPENDED') AS j
FULL JOIN (SELECT * FROM evora.callbacks WHERE outcome IS NULL) AS c
    ON c.job_id = j.id AND c.id = (j.callback ->> 'id')::uuid
WHERE j.id IS NULL OR c.id IS NULL OR j.lease_expires_at IS NOT NULL
ORDER BY 1;

-- name: over_max_pending
-- $1 seconds after a limit's change before its max_pending is judged. Every concrete key
-- whose jobs waiting to run (PENDING or WAITING) that were never started and were submitted
-- (created_at, the submitting transaction's now()) more than $1 s after the last change of
-- the limit governing the key outnumber its max_pending; those jobs, oldest first. Each of
-- them was admitted counting the ones submitted before it that still wait (a never-started
-- job leaves the waiting states only for good), so their number never exceeds max_pending.
-- Jobs from before the change (a lowered max_pending refuses only new ones) and jobs that
-- ran and came back (a retry, a release, a redrive: never refused) are left out.
WITH holders AS (
    SELECT DISTINCT j.id, k.key, j.created_at
    FROM evora.jobs j
    CROSS JOIN LATERAL unnest(('queue:' || j.queue) || j.limit_keys) AS k(key)
    WHERE j.state IN ('PENDING', 'WAITING') AND j.started_at IS NULL
      AND EXISTS (SELECT 1 FROM evora.flow_limits WHERE max_pending IS NOT NULL)
),
governed AS (
    SELECT h.*, g.key AS governed_by, g.max_pending
    FROM holders h
    CROSS JOIN LATERAL (
        SELECT l.key, l.max_pending FROM evora.flow_limits l
        WHERE l.key = h.key OR (l.stem IS NOT NULL AND starts_with(h.key, l.stem))
        ORDER BY l.key = h.key DESC, length(l.stem) DESC
        LIMIT 1) AS g
    WHERE g.max_pending IS NOT NULL
)
SELECT g.key, g.max_pending, array_agg(g.id ORDER BY g.created_at, g.id) AS job_ids
FROM governed g
JOIN (SELECT c.key, max(c.changed_at) AS changed_at FROM evora.flow_limit_changes c
      GROUP BY c.key) AS s ON s.key = g.governed_by
WHERE g.created_at > s.changed_at + make_interval(secs => $1::float8)
GROUP BY g.key, g.max_pending
HAVING count(*) > g.max_pending
ORDER BY g.key;

-- name: limit_changes
-- Every change of a limit (migration 0028), at the changing transaction's now().
SELECT seq, key, concurrency, rate_limit, rate_per_seconds, deleted, changed_at
FROM evora.flow_limit_changes;

-- name: prune_counts
-- How many finished jobs retention removed, per queue and final state.
SELECT queue, state::text AS state, pruned
FROM evora.job_prune_counts;

-- name: archived_upto
-- How far the event archive reaches (migration 0004): events up to this seq may have been
-- dropped by retention, the newer ones never were.
SELECT upto_seq FROM evora.event_archive_watermark;

-- name: fair_backlog_unwalked
-- Every key with jobs waiting to run (PENDING or WAITING) that its queue's fair claim would
-- never serve: the queue is not fair (a keyed job's submission makes it fair, in the same
-- statement: evora.fair_note()), or the key is out of the claims' walk (`backlogged` false,
-- or no row yet) with no ledger row to put it back. A claim takes a key out of the walk only
-- when its snapshot, taken under the queue's lock, shows no PENDING or WAITING job of the
-- key, and every move of a keyed job to PENDING or WAITING appends a ledger row in its own
-- transaction (record_moves, submit), which only the next claim deletes as it marks the key
-- again. So in any snapshot a key with work is walked or noted. Those jobs, per key.
SELECT j.queue, j.fairness_key AS key, f.queue IS NULL AS unfair,
       array_agg(j.id ORDER BY j.id) AS job_ids
FROM evora.jobs j
LEFT JOIN evora.fair_queues f ON f.queue = j.queue
LEFT JOIN evora.fair_keys k ON k.queue = j.queue AND k.key = j.fairness_key
WHERE j.state IN ('PENDING', 'WAITING') AND j.fairness_key IS NOT NULL
  AND (f.queue IS NULL
       OR (k.backlogged IS NOT TRUE
           AND NOT EXISTS (SELECT 1 FROM evora.fair_ledger l
                           WHERE l.queue = j.queue AND l.key = j.fairness_key)))
GROUP BY j.queue, j.fairness_key, f.queue IS NULL
ORDER BY 1, 2;

-- name: fair_running_overcounted
-- Every key whose fair_keys.running (the attempts a fair claim charged in advance and no
-- fold has settled) exceeds its RUNNING jobs plus the endings in the ledger not folded yet.
-- A fair claim raises `running` by the jobs it moves to RUNNING, every move out of RUNNING
-- appends its ending to the ledger in its own transaction, and a fold lowers `running` by
-- the endings it deletes (never below 0): so `running` never counts an attempt that neither
-- runs nor waits to be settled (the limited claim charges a fair queue's keyed jobs alike, by
-- evora.fair_charge()). With the key's RUNNING jobs.
WITH charged AS (
    SELECT k.queue, k.key, k.running FROM evora.fair_keys k WHERE k.running > 0
),
running AS (
    SELECT j.queue, j.fairness_key AS key, array_agg(j.id ORDER BY j.id) AS job_ids
    FROM evora.jobs j
    WHERE j.state = 'RUNNING' AND j.fairness_key IS NOT NULL
    GROUP BY 1, 2
),
ended AS (
    SELECT l.queue, l.key, sum(l.ended) AS ended FROM evora.fair_ledger l GROUP BY 1, 2
)
SELECT c.queue, c.key, c.running, coalesce(cardinality(r.job_ids), 0) AS running_jobs,
       coalesce(e.ended, 0)::bigint AS unfolded, coalesce(r.job_ids, '{}') AS job_ids
FROM charged c
LEFT JOIN running r ON r.queue = c.queue AND r.key = c.key
LEFT JOIN ended e ON e.queue = c.queue AND e.key = c.key
WHERE c.running > coalesce(cardinality(r.job_ids), 0) + coalesce(e.ended, 0)
ORDER BY 1, 2;
