-- Evora schema, version 15: one place for what every transition does after moving its rows,
-- and one for how a RUNNING attempt ends.
--
-- Every statement in storage/sql/transitions.sql moves jobs and then does the same: one
-- `job_events` row per moved job (the outbox, in the same transaction) and a NOTIFY hint for
-- each queue that gained a claimable job. `evora_record_moves()` is that, once.
--
-- Three statements end attempts: `fail` (a worker's failure), `release` (a worker hands the
-- claim back) and `expire_leases` (the sweeper, for a lease that ran out). Each decides, under
-- its own fence and lock, where each attempt goes (one `evora_attempt_end` per job);
-- `evora_end_attempts()` then moves the rows, the same way for all three. Likewise
-- `evora_leave_dlq()` moves jobs out of the DLQ for `leave_dlq` (an admin's retry or discard
-- of one job) and `redrive` (a queue's batch).

DO $$
BEGIN
    CREATE TYPE evora_move AS (
        job        jobs,       -- the job as it is after the move
        event      text,
        from_state job_state,
        worker     text,       -- the worker that caused it, if any
        data       jsonb       -- the event's data
    );
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- Records `moves` (one event each) and sends the NOTIFY hint of every queue that gained a
-- claimable job, except those in `suppressed` (this process notified them a moment ago), which
-- it returns as owed. One row, whatever it was given. plpgsql so that its plans are prepared
-- once per connection, like a statement's.
CREATE OR REPLACE FUNCTION evora_record_moves(moves evora_move[], suppressed text[])
RETURNS TABLE (notified text[], owed text[])
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH moved AS (
        SELECT (m.job).*, m.job AS whole, m.event, m.from_state, m.worker, m.data
        FROM unnest(moves) AS m
    ),
    recorded AS (
        INSERT INTO job_events (job_id, job_version, queue, type, event, from_state, to_state,
                                attempt, worker_id, at, data, job)
        SELECT id, version, queue, type, event, from_state, state,
               attempt, worker, updated_at, data, evora_job_image(whole)
        FROM moved
    ),
    -- a queue gains a claimable job when one becomes PENDING, when a group's running job
    -- moves (its next may run), and when an attempt claimed under a limit ends (its room is
    -- free again: migration 0014)
    claimable AS (
        SELECT DISTINCT queue AS q FROM moved
        WHERE state = 'PENDING' OR group_key IS NOT NULL OR (limited AND from_state = 'RUNNING')
    ),
    hinted AS (
        SELECT q, pg_notify('evora_jobs', q) AS sent
        FROM claimable
        WHERE q <> ALL(suppressed)
    )
    SELECT (SELECT array_agg(q) FROM hinted),
           (SELECT array_agg(q) FROM claimable WHERE q = ANY(suppressed));
END
$$;

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

-- Moves every decided job that is still RUNNING (the caller holds its row lock) and records
-- it; returns each moved job whole, with the queues notified and owed (evora_record_moves).
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
        RETURNING j AS whole, ROW(
            j,
            CASE WHEN d.to_state = 'CANCELLED' THEN 'cancelled'
                 WHEN d.to_state = 'DLQ' THEN 'dead_lettered'
                 ELSE d.pending_event END,
            'RUNNING',
            d.worker,
            (SELECT coalesce(jsonb_object_agg(key, value), '{}')
             FROM jsonb_each(jsonb_build_object(
                 'error', d.error, 'reason', d.reason,
                 'retry_at', CASE WHEN d.to_state = 'PENDING' THEN j.run_at END))
             WHERE value <> 'null')
        )::evora_move AS move
    ),
    recorded AS (
        SELECT * FROM evora_record_moves(ARRAY(SELECT move FROM moved), suppressed)
    )
    SELECT m.whole, r.notified, r.owed
    FROM moved m CROSS JOIN recorded r;
END
$$;

-- Moves DLQ jobs the caller holds locked: to PENDING (a retry: a fresh attempt budget, due
-- now, a time-to-live that already ran out dropped because the operator asked for the job to
-- run) or to CANCELLED (a discard). Returns each moved job whole, with the queues notified and
-- owed (evora_record_moves).
CREATE OR REPLACE FUNCTION evora_leave_dlq(ids uuid[], to_state job_state, suppressed text[])
RETURNS TABLE (job jobs, notified text[], owed text[])
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    retried CONSTANT boolean := to_state = 'PENDING';
BEGIN
    IF to_state NOT IN ('PENDING', 'CANCELLED') THEN
        RAISE EXCEPTION 'a job leaves the DLQ to PENDING or CANCELLED, not %', to_state;
    END IF;
    RETURN QUERY
    WITH moved AS (
        UPDATE jobs j
        SET state = to_state,
            attempt = CASE WHEN retried THEN 0 ELSE j.attempt END,
            run_at = CASE WHEN retried THEN evora_now() ELSE j.run_at END,
            finished_at = CASE WHEN retried THEN NULL ELSE evora_now() END,
            expires_at = CASE WHEN retried AND j.expires_at <= evora_now() THEN NULL
                              ELSE j.expires_at END,
            lease_expires_at = NULL, updated_at = evora_now(), version = j.version + 1
        WHERE j.id = ANY(ids) AND j.state = 'DLQ'
        RETURNING j AS whole, ROW(
            j,
            CASE WHEN retried THEN 'retried' ELSE 'cancelled' END,
            'DLQ',
            NULL,
            CASE WHEN retried THEN '{}' ELSE '{"reason": "discarded"}' END::jsonb
        )::evora_move AS move
    ),
    recorded AS (
        SELECT * FROM evora_record_moves(ARRAY(SELECT move FROM moved), suppressed)
    )
    SELECT m.whole, r.notified, r.owed
    FROM moved m CROSS JOIN recorded r;
END
$$;
