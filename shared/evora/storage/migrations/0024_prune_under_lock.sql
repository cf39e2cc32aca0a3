-- Evora schema, version 24: retention decides whether a DLQ job is still waited for only
-- once it holds the job's row.
--
-- A DLQ job that WAITING jobs depend on is kept (docs/dependencies.md): pruned, it could
-- never be retried or discarded, and they would wait for ever. Until now one statement asked
-- "does a WAITING job depend on it?" with the snapshot it took when it started, then locked
-- the job with FOR UPDATE SKIP LOCKED. A dependent whose submission committed in between
-- (the submission locks the job in evora_hold_dependencies(), and so sets has_dependents)
-- was invisible to that question: the lock's re-check sees the job's newest version, but
-- the dependents, other rows, only as the snapshot did. With many kept DLQ jobs ahead of it,
-- a pass reads for tens of milliseconds before it reaches the job, long enough for a
-- submission to commit: the job was deleted, its dependent stayed WAITING.
--
-- Now the candidates are locked first, then asked again in a second statement, whose new
-- snapshot is taken after the locks were granted. It sees every dependent committed before
-- that, and no later one can commit: a dependent's submission must lock the job first, and
-- waits until the prune commits; it then finds no job and is refused as naming none
-- (unknown_dependency), never stored waiting for a job that is gone.

-- The WAITING jobs that depend on `dependency`, as the calling statement's snapshot shows
-- them. A set-returning SQL function of one query: the planner inlines it where it is
-- called in FROM, so `EXISTS (SELECT 1 FROM evora_waiting_dependents(f.id))` plans exactly
-- as the EXISTS written out, a probe of job_dependencies_dependents per job asked about.
-- (A boolean function around the EXISTS would not be inlined: a call per job.)
CREATE FUNCTION evora_waiting_dependents(dependency uuid) RETURNS SETOF uuid
LANGUAGE sql STABLE AS $$
    SELECT d.job_id FROM job_dependencies d JOIN jobs w ON w.id = d.job_id
    WHERE d.depends_on = dependency AND w.state = 'WAITING'
$$;

-- Removes the oldest jobs that finished in `finished` (COMPLETED, CANCELLED or DLQ) more
-- than `age` seconds ago, at most `batch` of them, and counts them in job_prune_counts (by
-- queue and state, in one order, so two passes at once cannot deadlock on the counters).
-- Returns how many were removed. A job that WAITING jobs depend on is kept.
CREATE FUNCTION evora_prune_finished(age float8, batch integer, finished job_state)
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
        SELECT f.id FROM jobs f
        WHERE f.state = finished AND f.state IN ('COMPLETED', 'CANCELLED', 'DLQ')
          AND f.finished_at < evora_now() - make_interval(secs => age)
          AND NOT (f.has_dependents AND EXISTS (SELECT 1 FROM evora_waiting_dependents(f.id)))
        ORDER BY f.finished_at
        LIMIT batch
        FOR UPDATE SKIP LOCKED);
    -- A new statement, with a snapshot taken after the locks: the answer that counts.
    WITH gone AS (
        DELETE FROM jobs f
        WHERE f.id = ANY(held)
          AND NOT (f.has_dependents AND EXISTS (SELECT 1 FROM evora_waiting_dependents(f.id)))
        RETURNING f.queue, f.state
    ),
    counted AS (
        INSERT INTO job_prune_counts AS c (queue, state, pruned)
        SELECT g.queue, g.state, count(*) FROM gone g GROUP BY g.queue, g.state
        ORDER BY g.queue, g.state
        ON CONFLICT (queue, state) DO UPDATE SET pruned = c.pruned + excluded.pruned
    )
    SELECT count(*) INTO removed FROM gone;
    RETURN removed;
END
$$;
