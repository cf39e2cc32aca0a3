-- What only the sweeper asks of PostgreSQL, apart from lease and TTL expiry (transitions.sql):
-- the next deadline to wake for, retention, and health figures. Every prune is ONE short
-- call that removes at most a batch of rows picked with FOR UPDATE SKIP LOCKED, so it
-- never holds a long transaction, never waits for a row someone else is changing, and two
-- sweepers running at once never remove the same row.

-- name: seconds_until_deadline
-- Seconds until the earliest lease, TTL, time limit or callback timeout runs out, by the
-- database's clock (a replica's own clock cannot skew it), negative if one is already due,
-- NULL if none is pending. The lease and TTL `min`s are one probe of a partial index each
-- (jobs_running_lease, jobs_pending_ttl); the time limits (max_duration_seconds and its
-- grace, the `time_out` statement's deadline) read the RUNNING jobs that have one
-- (jobs_running_time_limit); the callbacks are those `expire_callbacks` settles, read in
-- the order of callbacks_due until the first whose job is SUSPENDED (all of them, normally).
SELECT extract(epoch FROM least(
    (SELECT min(lease_expires_at) FROM evora.jobs WHERE state = 'RUNNING'),
    (SELECT min(expires_at) FROM evora.jobs
     WHERE state = 'PENDING' AND expires_at IS NOT NULL AND started_at IS NULL),
    (SELECT min(started_at + make_interval(secs => max_duration_seconds + lease_seconds))
     FROM evora.jobs WHERE state = 'RUNNING' AND max_duration_seconds IS NOT NULL),
    (SELECT c.timeout_at FROM evora.callbacks c JOIN evora.jobs j ON j.id = c.job_id
     WHERE c.outcome IS NULL AND j.state = 'SUSPENDED'
     ORDER BY c.timeout_at LIMIT 1)
) - evora.clock_now())::float8;

-- name: prune_finished
-- $1 age in seconds, $2 at most this many rows, $3 the finished state. Removes the oldest jobs
-- that finished in that state more than $1 seconds ago and adds them to job_prune_counts in
-- the same transaction, so the read models can still match the true per-state counts.
-- A job in the DLQ that others still wait for is kept: it may yet be retried or discarded,
-- and only then do they move on (docs/dependencies.md). evora.prune_finished() (migration
-- 0024) locks its candidates first and asks whether they are waited for only then, in a
-- statement of its own: a dependent's submission that commits while the pass runs is seen.
SELECT evora.prune_finished($1, $2, $3::evora.job_state);

-- name: prune_idempotency_keys
-- $1 age in seconds, $2 at most this many rows. The window is for the key's age, but a key
-- whose job still exists, in any state, is kept: replaying that submission must answer with
-- that job (a DLQ job outlives the default key window), never create a second one. A key
-- therefore lives for the window or as long as its job, whichever is longer.
WITH gone AS (
    DELETE FROM evora.idempotency_keys
    WHERE (queue, key) IN (
        SELECT k.queue, k.key FROM evora.idempotency_keys k
        WHERE k.created_at < evora.clock_now() - make_interval(secs => $1)
          AND NOT EXISTS (SELECT 1 FROM evora.jobs j WHERE j.id = k.job_id)
        ORDER BY k.created_at
        LIMIT $2
        FOR UPDATE OF k SKIP LOCKED
    )
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: prune_submission_keys
-- $1 at most this many rows. The debounce and throttle keys that answer no later submission
-- (evora.prune_submission_keys(), functions/retention.sql).
SELECT evora.prune_submission_keys($1);

-- name: prune_flow_buckets
-- $1 the key after which to look ('' from the start), $2 at most this many keys looked at.
-- The token buckets among them that carry nothing (full by now, or no rate to count) are
-- removed; how many, and the last key looked at (NULL: no keys after it)
-- (evora.prune_flow_buckets(), functions/retention.sql).
SELECT pruned, last_key FROM evora.prune_flow_buckets($1, $2);

-- name: make_event_partitions
-- $1 width of a partition (seconds), $2 how many to have ahead of the clock; returns the
-- seconds of partitions ahead once made (evora.make_event_partitions(), functions/retention.sql).
SELECT evora.make_event_partitions($1, $2);

-- name: expired_event_partitions
-- $1 the events window (seconds), $2 whether only archived events may go. The partitions of
-- the outbox retention removes now (the events written one by one and their twins for the
-- batches, migration 0064), oldest first, each with the statements that do it: a DETACH ...
-- CONCURRENTLY (it never blocks writers: it takes a SHARE UPDATE EXCLUSIVE lock on the
-- parent, then waits for the readers of the partition; run outside a transaction, each under
-- the sweeper's lock_timeout), FINALIZE for one an interrupted round left pending, then DROP
-- TABLE. The SQL function decides what is expired, consumed by every projector generation
-- and (with $2) archived. `range`: the partition is the rows', one per range of time (its
-- twin for the batches comes with it), which is what the sweeper counts.
SELECT p.name, p.parent = 'evora.job_event_rows' AS range,
       CASE WHEN NOT p.attached THEN NULL
            WHEN p.detach_pending
            THEN format('ALTER TABLE %s DETACH PARTITION evora.%I FINALIZE', p.parent, p.name)
            ELSE format('ALTER TABLE %s DETACH PARTITION evora.%I CONCURRENTLY', p.parent, p.name)
       END AS detach,
       format('DROP TABLE evora.%I', p.name) AS drop
FROM evora.expired_event_tables($1, $2) p;

-- name: record_projector_progress
-- $1 generation, $2 the snapshot every span it consumed ended at (text), $3 whether the
-- generation is the active one, $4 seconds without progress after which a newer generation's
-- row counts as abandoned. The projector's half: after each checkpoint it records how
-- far it has consumed, so that retention (which has no MongoDB) knows: every event visible
-- in the snapshot, and so every event with an xid below the snapshot's xmin, which is what
-- retention and the archive go by (conservative: a transaction left open holds it back, and
-- them with it, not the projector). Once a generation is active the rows of older ones go:
-- their read models are dropped and must not hold retention back for ever. So does the row of
-- a newer one (a rebuild's) that has recorded nothing for $4 seconds: a rebuild that died
-- would hold retention back for ever, and one run again starts over. A rebuild that was only
-- slow finds its row gone at its next record and stops (`kept` false: it had recorded before
-- and its row is not there), since events it had not read yet may have gone meanwhile.
-- Answers whether the generation's row was there before this record.
WITH kept AS (
    SELECT EXISTS (SELECT 1 FROM evora.projector_progress p WHERE p.generation = $1) AS kept
),
recorded AS (
    INSERT INTO evora.projector_progress (generation, xid, snapshot, updated_at)
    VALUES ($1, pg_snapshot_xmin($2::text::pg_snapshot), $2::text::pg_snapshot,
            evora.clock_now())
    ON CONFLICT (generation) DO UPDATE
        SET xid = excluded.xid, snapshot = excluded.snapshot, updated_at = evora.clock_now()
),
dropped AS (
    DELETE FROM evora.projector_progress p
    WHERE $3 AND (p.generation < $1
                  OR (p.generation > $1
                      AND p.updated_at < evora.clock_now() - make_interval(secs => $4)))
)
SELECT kept FROM kept;

-- name: projector_progress_kept
-- $1 generation: whether its progress row is there (a rebuild checks before it switches, in
-- case its row was removed as an abandoned rebuild's after its last record).
SELECT EXISTS (SELECT 1 FROM evora.projector_progress p WHERE p.generation = $1);

-- name: oldest_writing_transaction_seconds
-- Age of the oldest transaction in the cluster that holds an xid (has written something).
-- Such a transaction holds back vacuum, and event retention and the archive (they go by
-- `pg_snapshot_xmin`), for as long as it stays open; not the projector, which reads past it.
-- Cluster-wide on purpose: xids are.
SELECT coalesce(extract(epoch FROM clock_timestamp() - min(xact_start)), 0)::float8
FROM pg_stat_activity
WHERE backend_xid IS NOT NULL;

-- name: event_partitions_ahead
-- Seconds of the outbox's partitions ahead of Evora's clock (negative: an event now has no
-- partition and its transition fails).
SELECT extract(epoch FROM max(p.upper) - evora.clock_now())::float8 FROM evora.event_partitions() p;

-- name: jobs_dead_tuples
-- Dead row versions in `evora.jobs` as the statistics collector last saw them.
SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables WHERE relid = 'evora.jobs'::regclass;
