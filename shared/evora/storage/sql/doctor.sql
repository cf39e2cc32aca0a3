-- What `evora doctor` (services/evora_services/cli/doctor.py) reads: each a figure an
-- operator acts on.
-- All are reads of PostgreSQL's own views or of small tables, cheap on a busy queue.

-- name: oldest_xmin_holder
-- The session whose transaction holds back the cluster's xmin the longest (a snapshot or an
-- xid: vacuum keeps every row version it may still see, and event retention and the archive
-- go by pg_snapshot_xmin; the projector reads past it). Cluster-wide on purpose: xmin is.
-- None when nothing holds one.
SELECT pid, coalesce(nullif(application_name, ''), usename::text, '?') AS application,
       state, extract(epoch FROM clock_timestamp() - xact_start)::float8 AS seconds
FROM pg_stat_activity
WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
  AND xact_start IS NOT NULL AND pid <> pg_backend_pid()
ORDER BY xact_start
LIMIT 1;

-- name: dead_tuples
-- Dead and live row versions of each of Evora's tables, as the statistics collector last
-- saw them.
SELECT relname::text AS table_name, n_dead_tup AS dead, n_live_tup AS live
FROM pg_stat_user_tables
WHERE schemaname = 'evora'
ORDER BY n_dead_tup DESC;

-- name: outbox_backlog
-- Events the active projector generation (the newest recorded) has not consumed yet, counted
-- up to $1 (the count stops there: a backlog is big or it is not), the age of the oldest
-- of them, and how long ago the projector recorded progress. The unconsumed events are
-- those not visible in its snapshot (migration 0031; a row without one: xid >= its xid);
-- without a progress row, every event is.
WITH progress AS (
    SELECT xid, snapshot, updated_at FROM evora.projector_progress ORDER BY generation DESC LIMIT 1
), pending AS (
    SELECT e.at FROM evora.job_events e
    WHERE e.xid >= coalesce((SELECT xid FROM progress), '0'::xid8)
      AND NOT coalesce(pg_visible_in_snapshot(e.xid, (SELECT snapshot FROM progress)), false)
    LIMIT $1
)
SELECT (SELECT count(*) FROM pending) AS events,
       extract(epoch FROM clock_timestamp() - (SELECT min(at) FROM pending))::float8
           AS oldest_seconds,
       extract(epoch FROM clock_timestamp() - (SELECT updated_at FROM progress))::float8
           AS progress_seconds;

-- name: advisory_lock_held
-- Whether some session of this database holds the session advisory lock on key $1 (bigint
-- keys are kept as classid = high 32 bits, objid = low 32 bits, objsubid = 1).
SELECT EXISTS (
    SELECT FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND classid::bigint = ($1::bigint >> 32) & 4294967295
      AND objid::bigint = $1::bigint & 4294967295
);

-- name: database_clock
-- The database's clock now (not the transaction's start), seconds since the epoch.
SELECT extract(epoch FROM clock_timestamp())::float8;

-- name: settings_differing
-- Which of the settings $1 (names) this session does not have at the values $2 (in
-- pg_settings' base units: milliseconds for the timeouts), in the order given.
SELECT coalesce(array_agg(w.name ORDER BY w.ord), '{}')
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS w (name, value, ord)
JOIN pg_settings s ON s.name = w.name
WHERE s.setting <> w.value;
