-- Evora schema, version 20: evora_end_attempts() of version 15, with the same signature and
-- the same effect, at a cost that follows the attempts it ends rather than the jobs running
-- anywhere.
--
-- The fence of an attempt's end is "the job is still RUNNING". Written as `j.state =
-- 'RUNNING'`, it is a filter on `jobs` that the planner may serve by scanning every RUNNING
-- job of every queue (through an index on state; `state` keeps no statistics, so it expects a
-- few hundred) and hash-joining the attempts to them: a failure of one job read thousands of
-- rows while thousands ran elsewhere. Here the expected state comes with each attempt
-- (`fenced`, in a materialized CTE so that it stays a column and is not folded back into a
-- constant), which makes the fence part of the join: each attempt is one probe of the primary
-- key. The fail and complete statements of storage/sql/transitions.sql do the same.

CREATE OR REPLACE FUNCTION evora_end_attempts(ends evora_attempt_end[], suppressed text[])
RETURNS TABLE (job jobs, notified text[], owed text[])
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH decided AS MATERIALIZED (
        SELECT *, 'RUNNING'::job_state AS fenced FROM unnest(ends)
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
        FROM decided d WHERE j.id = d.id AND j.state = d.fenced
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
