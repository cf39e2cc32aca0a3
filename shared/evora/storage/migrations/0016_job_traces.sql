-- The W3C trace context (`traceparent`) a job was submitted with, for the jobs that carry
-- one: a side table, so a job without one (every job when nobody traces) costs nothing,
-- neither a column in the hot `jobs` rows nor a write. Written in the submission's own
-- transaction, for created jobs only (an idempotent replay keeps the original's), and read
-- by a dispatcher that traces, for the jobs a claim hands out. Removed with its job.

CREATE TABLE job_traces (
    job_id      uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    -- validated by the api: version 00, 55 characters
    traceparent text NOT NULL CHECK (length(traceparent) = 55)
);
