-- Evora schema, version 15: one place where a RUNNING attempt ends.
--
-- Three statements end attempts (storage/sql/transitions.sql): `fail` (a worker's failure),
-- `release` (a worker hands the claim back) and `expire_leases` (the sweeper, for a lease that
-- ran out). Each decides, under its own fence and lock, where each attempt goes; what follows
-- is the same for all three and lives here once: the row moves, one `job_events` row records
-- it, and the queues that gained a claimable job get their NOTIFY hint. A decision is one
-- `evora_attempt_end` per job.

DO $$
BEGIN
    CREATE TYPE evora_attempt_end AS (
        id            uuid,
        to_state      job_state,
        -- the attempt's error to record (NULL keeps the last one)
        error         jsonb,
        -- the event's `reason` (why the job left the retry path), NULL when it goes back
        reason        text,
        -- seconds until a PENDING job is due again
        delay         float8,
        -- a release hands the claim back uncounted
        released      boolean,
        -- the event written when the job goes back to PENDING
        pending_event text,
        worker        text
    );
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- Moves every decided job that is still RUNNING (the caller holds its row lock) and returns
-- it whole, once per moved job, with the queues notified and the ones owed a hint because they
-- are in `suppressed` (this process notified them a moment ago). plpgsql so that its plan is
-- prepared once per connection, like a statement's.
CREATE OR REPLACE FUNCTION evora_end_attempts(ends evora_attempt_end[], suppressed text[])
RETURNS TABLE (job jobs, notified text[], owed text[])
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH decided AS (
        SELECT * FROM unnest(ends)
    ),
    moved AS (
        UPDATE jobs j
        SET state = d.to_state,
            -- a release hands the claim back uncounted, unless it ends the job (cancel
            -- requested): then the attempt ran and stays counted
            attempt = j.attempt - CASE WHEN d.released AND d.to_state = 'PENDING' THEN 1 ELSE 0 END,
            last_error = coalesce(d.error, j.last_error),
            lease_expires_at = NULL,
            run_at = CASE WHEN d.to_state = 'PENDING'
                          THEN evora_now() + make_interval(secs => d.delay) ELSE j.run_at END,
            finished_at = CASE WHEN d.to_state = 'PENDING' THEN NULL ELSE evora_now() END,
            updated_at = evora_now(), version = j.version + 1
        FROM decided d WHERE j.id = d.id AND j.state = 'RUNNING'
        RETURNING j.*, j AS whole, evora_job_image(j) AS image,
            CASE WHEN d.to_state = 'CANCELLED' THEN 'cancelled'
                 WHEN d.to_state = 'DLQ' THEN 'dead_lettered'
                 ELSE d.pending_event END AS ev_name,
            d.worker AS ev_worker,
            (SELECT coalesce(jsonb_object_agg(key, value), '{}')
             FROM jsonb_each(jsonb_build_object(
                 'error', d.error, 'reason', d.reason,
                 'retry_at', CASE WHEN d.to_state = 'PENDING' THEN j.run_at END))
             WHERE value <> 'null') AS ev_data
    ),
    recorded AS (
        INSERT INTO job_events (job_id, job_version, queue, type, event, from_state, to_state,
                                attempt, worker_id, at, data, job)
        SELECT id, version, queue, type, ev_name, 'RUNNING', state,
               attempt, ev_worker, updated_at, ev_data, image
        FROM moved
    ),
    claimable AS (
        SELECT DISTINCT queue AS q FROM moved WHERE state = 'PENDING' OR group_key IS NOT NULL
    ),
    hinted AS (
        SELECT q, pg_notify('evora_jobs', q) AS sent
        FROM claimable
        WHERE q <> ALL(suppressed)
    )
    SELECT m.whole,
           (SELECT array_agg(q) FROM hinted),
           (SELECT array_agg(q) FROM claimable WHERE q = ANY(suppressed))
    FROM moved m;
END
$$;
