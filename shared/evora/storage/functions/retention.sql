-- Retention (docs/deploy.md): pruning finished jobs and dropping archived events.
--
-- The current text of this area's functions and triggers: edit them here. `evora migrate`
-- runs the file again whole, so every statement is re-runnable (CONTRIBUTING.md says how).

-- The retention path: removes up to `max_rows` events, oldest seq first, that are archived
-- (inside the watermark), consumed by every projector generation that has recorded
-- progress, and older than `older_than_seconds`. Asking for more than the archive holds is
-- an error, not a silent clamp: the caller has the wrong watermark. Returns the rows removed.
CREATE OR REPLACE FUNCTION evora.drop_archived_events(
    upto_seq bigint, older_than_seconds float8, max_rows integer
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = evora, pg_temp AS $$
DECLARE
    mark     evora.event_archive_watermark;
    consumed xid8;
    removed  bigint;
BEGIN
    IF older_than_seconds IS NULL OR older_than_seconds < 0 OR max_rows IS NULL OR max_rows < 1 THEN
        RAISE EXCEPTION 'invalid retention arguments (older than %, at most % rows)',
            older_than_seconds, max_rows USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO STRICT mark FROM evora.event_archive_watermark;
    IF upto_seq IS NULL OR upto_seq > mark.upto_seq THEN
        RAISE EXCEPTION 'refusing to drop events up to seq %: the archive reaches only seq %',
            upto_seq, mark.upto_seq USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- No recorded progress means nothing is known to be consumed.
    -- (ORDER BY rather than min(): xid8 has no min aggregate before PostgreSQL 16)
    SELECT p.xid INTO consumed FROM evora.projector_progress p ORDER BY p.xid LIMIT 1;
    IF consumed IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM set_config('evora.drop_archived_events', 'on', true);
    WITH gone AS (
        DELETE FROM evora.job_events
        WHERE seq IN (
            SELECT e.seq FROM evora.job_events e
            WHERE e.seq <= upto_seq AND e.xid < mark.below_xid AND e.xid < consumed
              AND e.at < now() - make_interval(secs => older_than_seconds)
            ORDER BY e.seq
            LIMIT max_rows
        )
        RETURNING 1
    )
    SELECT count(*) INTO removed FROM gone;
    PERFORM set_config('evora.drop_archived_events', 'off', true);
    RETURN removed;
END
$$;

-- Removes the oldest jobs that finished in `finished` (COMPLETED, CANCELLED or DLQ) more
-- than `age` seconds ago, at most `batch` of them, and counts them in job_prune_counts (by
-- queue and state, in one order, so two passes at once cannot deadlock on the counters).
-- Returns how many were removed. A job that WAITING jobs depend on is kept.
CREATE OR REPLACE FUNCTION evora.prune_finished(age float8, batch integer, finished evora.job_state)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    held uuid[];
    removed bigint;
BEGIN
    -- The candidates, locked; rows others hold are skipped, never waited for. The literal
    -- list beside `state = finished` lets the planner prove that the jobs_finished partial
    -- index applies in a generic plan too. The dependents are asked here only to pass over
    -- the jobs already known to be kept, which would otherwise fill every batch.
    held := ARRAY(
        SELECT f.id FROM evora.jobs f
        WHERE f.state = finished AND f.state IN ('COMPLETED', 'CANCELLED', 'DLQ')
          AND f.finished_at < evora.clock_now() - make_interval(secs => age)
          AND NOT (f.has_dependents AND EXISTS (SELECT 1 FROM evora.waiting_dependents(f.id)))
        ORDER BY f.finished_at
        LIMIT batch
        FOR UPDATE SKIP LOCKED);
    -- A new statement, with a snapshot taken after the locks: the answer that counts.
    WITH gone AS (
        DELETE FROM evora.jobs f
        WHERE f.id = ANY(held)
          AND NOT (f.has_dependents AND EXISTS (SELECT 1 FROM evora.waiting_dependents(f.id)))
        RETURNING f.queue, f.state
    ),
    counted AS (
        INSERT INTO evora.job_prune_counts AS c (queue, state, pruned)
        SELECT g.queue, g.state, count(*) FROM gone g GROUP BY g.queue, g.state
        ORDER BY g.queue, g.state
        ON CONFLICT (queue, state) DO UPDATE SET pruned = c.pruned + excluded.pruned
    )
    SELECT count(*) INTO removed FROM gone;
    RETURN removed;
END
$$;
