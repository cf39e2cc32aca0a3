-- Evora schema, version 68: the admin listing pages by the job's id, and jobs_submit_seq goes.
--
-- jobs_submit_seq, a unique index of every job by its submission number, was entered by every
-- non-HOT update of a job: its submission, its claim and its completion, ~160 B of WAL per
-- drained job (bench.drain_pg, 2026-12-02), for one reader: the admin listing
-- (`GET /v1/jobs`, newest first), which read the RUNNING jobs and the unfiltered pages
-- through it. A job's id is a UUIDv7, ordered by the time it was made (storage/submissions.py,
-- evora.uuid7()), and the primary key, which every transition enters anyway, orders the jobs
-- by it; so the listing pages by id (storage/queries.py, list_jobs), and the index of the
-- jobs at rest is keyed by id too. Nothing else read jobs_submit_seq: the claims order by
-- submit_seq through their own indexes, which keep it.
--
-- Building an index locks `jobs` against writes for the build. On a small `jobs` (a new
-- installation, a queue that keeps little) it is built here and the two old indexes dropped,
-- under a lock that keeps every reader and writer of `jobs` waiting until the migrations'
-- transaction commits; on a larger one it is left to `evora migrate`, which builds it
-- CONCURRENTLY right after this transaction (evora.index_builds; storage/migrate.py) and then
-- drops the two it replaces (evora.retiring_indexes). Until it is built the listing is right
-- but a page filtered by queue reads the queue's jobs at rest through the old index.

-- Indexes of plain tables a migration left to `evora migrate` to build CONCURRENTLY after its
-- transaction: each index's name (in schema evora) and its CREATE INDEX statement.
CREATE TABLE evora.index_builds (
    name  text PRIMARY KEY,
    build text NOT NULL
);

DO $$
DECLARE
    build CONSTANT text := 'CREATE INDEX jobs_listing_by_id ON evora.jobs (queue, state, id) '
                           'WHERE state <> ''RUNNING''';
BEGIN
    IF pg_total_relation_size('evora.jobs') < 8 * 1024 * 1024 THEN
        -- The strongest lock first. The build's SHARE lock and then the drops' ACCESS
        -- EXCLUSIVE deadlocked with a writer whose transaction had read `jobs` before the
        -- build and wrote it after (the rolling upgrade's test, under load). Waiting here
        -- holds nothing a writer needs: it queues behind the lock request, or goes ahead of
        -- it, and the lock_timeout and retries of `evora migrate` bound the wait.
        LOCK TABLE evora.jobs IN ACCESS EXCLUSIVE MODE;
        EXECUTE build;
        DROP INDEX evora.jobs_listing_at_rest;
        DROP INDEX evora.jobs_submit_seq;
    ELSE
        INSERT INTO evora.index_builds (name, build) VALUES ('jobs_listing_by_id', build);
        INSERT INTO evora.retiring_indexes (name, replaced_by)
        VALUES ('jobs_listing_at_rest', 'jobs_listing_by_id'),
               ('jobs_submit_seq', 'jobs_listing_by_id');
    END IF;
END
$$;
