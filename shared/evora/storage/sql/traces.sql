-- The trace context jobs were submitted with (migrations/0016_job_traces.sql).

-- name: keep_traces
-- $1 job ids, $2 their traceparents (same order): stored with jobs just created in this
-- transaction.
INSERT INTO evora.job_traces (job_id, traceparent)
SELECT * FROM unnest($1::uuid[], $2::text[]);

-- name: traces_of
-- $1 job ids: those of them that carry a traceparent, with it.
SELECT job_id, traceparent FROM evora.job_traces WHERE job_id = ANY($1::uuid[]);
