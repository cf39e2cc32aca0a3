-- Evora schema, version 46: a hard time limit per attempt (docs/jobs-that-wait.md, "A hard
-- time limit"). A job submitted with `max_duration_seconds` may run that long per attempt,
-- however often it heartbeats: past it, heartbeats answer `timeout_requested` (the worker
-- stops its handler and fails the attempt), and once the grace (the job's lease_seconds)
-- has passed too, the sweeper revokes the lease and fails the attempt with reason `timeout`.
-- NULL: no limit but the lease, as before. The previous release's services never write it.
ALTER TABLE evora.jobs ADD COLUMN max_duration_seconds integer
    CONSTRAINT jobs_max_duration_seconds_check CHECK (max_duration_seconds > 0);

-- The RUNNING jobs that have a time limit, by the start of their attempt: what the
-- sweeper's `time_out` pass and its next deadline read. Few rows (only jobs with a limit).
CREATE INDEX jobs_running_time_limit ON evora.jobs (started_at)
    WHERE state = 'RUNNING' AND max_duration_seconds IS NOT NULL;

-- evora.submit() takes the field too (functions/submissions.sql, evora.validated()).
ALTER TYPE evora.submission ADD ATTRIBUTE max_duration_seconds integer;

-- The store and the fingerprints take the limit as one more argument, last and with a
-- default, so the previous release's `submit` statement (22 arguments) resolves to the new
-- store unchanged while it runs beside this one (functions/submissions.sql makes them anew).
DROP FUNCTION evora.store_submissions(
    uuid[], text[], text[], jsonb[], smallint[], timestamptz[], float8[], integer[], integer[],
    float8[], float8[], float8[], timestamptz[], text[], text[], bytea[], text[], integer[],
    uuid[], text[], integer[], text[]);
DROP FUNCTION evora.submission_fingerprints(
    uuid[], text[], text[], jsonb[], smallint[], timestamptz[], float8[], integer[], integer[],
    float8[], float8[], float8[], timestamptz[], text[], text[], integer[], uuid[], text[],
    integer[], text[]);
DROP FUNCTION evora.submission_fingerprint(
    text, text, jsonb, smallint, timestamptz, float8, integer, integer, float8, float8, float8,
    timestamptz, text, text[]);
