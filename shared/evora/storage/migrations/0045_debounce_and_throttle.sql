-- Evora schema, version 45: debounce and throttle by key (docs/flow-control.md, "Debounce
-- and throttle"). A submission with `debounce: {key, ...}` is absorbed by the PENDING,
-- never started job of that key in its queue (its payload replaced, its run time pushed
-- back, never past `run_by`); one with `throttle: {key, window_seconds}` within the window of
-- the last job admitted with that key answers that job and stores nothing.
--
-- One row per (queue, kind, key) ever used: the job the key names now. It is not a column of
-- the jobs: the job keeps no trace of a key (the job image, the read models and the previous
-- release's statements stay as they are), and the look-up is one primary-key probe. The row
-- is only read and written by a submission holding the key's transaction advisory lock
-- (evora.debounce_and_throttle(), functions/submissions.sql), so it needs no unique-violation
-- handling of its own; the primary key makes the probe and keeps one row per key. There is no
-- foreign key to the job: a pruned job leaves its key naming nothing, which reads as "no job"
-- (a new one is made), and pruning pays nothing for keys.
CREATE TABLE evora.submission_keys (
    queue text NOT NULL,
    kind text NOT NULL CONSTRAINT submission_keys_kind CHECK (kind IN ('debounce', 'throttle')),
    key text NOT NULL,
    job_id uuid NOT NULL,
    -- when the job was made (the throttle window counts from it)
    since timestamptz NOT NULL,
    -- debounce only: the latest run_at a later submission may push the job to
    run_by timestamptz,
    PRIMARY KEY (queue, kind, key),
    CONSTRAINT submission_keys_run_by CHECK ((kind = 'debounce') = (run_by IS NOT NULL))
);


-- A submission's debounce and throttle fields, as evora.validated() reads them (NULL: not
-- given).
ALTER TYPE evora.submission
    ADD ATTRIBUTE debounce_key text,
    ADD ATTRIBUTE debounce_delay float8,
    ADD ATTRIBUTE debounce_max_delay float8,
    ADD ATTRIBUTE throttle_key text,
    ADD ATTRIBUTE throttle_window float8;
