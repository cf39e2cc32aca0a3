-- Evora schema, version 61: what a job leaves in other tables (its callbacks, the dependencies
-- it waits on, its trace context, the children it spawned) is removed with it by one statement
-- per table for a whole DELETE of jobs (the trigger jobs_references_removed,
-- functions/retention.sql), not by four foreign keys' ON DELETE CASCADE, which ran four
-- queries for every deleted job: ~10 of the ~13.5 us of PostgreSQL CPU retention spent per
-- job (docs/benchmarks/2026-11-29-retention-without-cascades.md). The function files run
-- after this in the same transaction and create the trigger, so no DELETE commits between
-- the two. Dropping a foreign key takes a brief ACCESS EXCLUSIVE lock on both tables.
ALTER TABLE evora.callbacks DROP CONSTRAINT IF EXISTS callbacks_job_id_fkey;
ALTER TABLE evora.job_dependencies DROP CONSTRAINT IF EXISTS job_dependencies_job_id_fkey;
ALTER TABLE evora.job_traces DROP CONSTRAINT IF EXISTS job_traces_job_id_fkey;
ALTER TABLE evora.spawned_children DROP CONSTRAINT IF EXISTS spawned_children_parent_fkey;
