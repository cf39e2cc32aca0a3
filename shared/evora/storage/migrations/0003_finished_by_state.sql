-- Evora schema, version 3: retention scans one finished state at a time.
--
-- The sweeper prunes COMPLETED and CANCELLED jobs after a day but DLQ jobs after a week.
-- Ordered by finished_at alone, a prune of COMPLETED jobs would read past every DLQ job
-- still inside its longer window; led by state, each prune reads only what it deletes.

DROP INDEX IF EXISTS jobs_finished;

CREATE INDEX jobs_finished ON jobs (state, finished_at)
    WHERE state IN ('COMPLETED', 'CANCELLED', 'DLQ');
