-- Evora schema, version 35: snooze (docs/jobs-that-wait.md). A worker hands its job back to
-- run again after a delay without using up an attempt (`POST /v1/jobs/{id}/snooze`, event
-- `snoozed`); `snoozes` counts the times it did, so the job resource shows how long a job has
-- been polling, since its attempt number does not grow. The previous release's services
-- never write it: a job they release keeps its count.
ALTER TABLE evora.jobs ADD COLUMN snoozes integer NOT NULL DEFAULT 0;

-- a snooze is a move of its own in the state machine (RUNNING -> PENDING, as a release)
INSERT INTO evora.job_transitions (from_state, to_state, event) VALUES
    ('RUNNING', 'PENDING', 'snoozed');
