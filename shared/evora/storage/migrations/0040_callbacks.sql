-- Evora schema, version 40: callbacks (docs/callbacks.md). A running job suspends itself on a
-- callback (`POST /v1/jobs/{id}/suspend`): it leaves RUNNING for SUSPENDED, holding no lease
-- and no limit slot, until an external system resolves the callback (`POST
-- /v1/callbacks/{callback_id}`, or evora.resolve_callback() in SQL) or its timeout passes
-- (the sweeper). The functions are in functions/callbacks.sql.
--
-- ALTER TYPE ... ADD VALUE cannot be used in the transaction that adds it: the runner commits
-- it first (IF NOT EXISTS keeps it re-runnable).

ALTER TYPE evora.job_state ADD VALUE IF NOT EXISTS 'SUSPENDED';

-- evora:commit

-- One row per callback a job suspended on, kept until the job is pruned: a second resolution
-- is answered with the first one's, and a resolution after the timeout or a cancel is told
-- apart from an unknown callback. `id` is the callback's public name (on the job, in events,
-- on the dashboard); the credential that resolves it is the callback id handed to the worker,
-- stored only as its SHA-256 (`secret_hash`), so nothing that reads the database (a replica, a
-- backup, the job resource, the read models) can resolve a callback.
CREATE TABLE evora.callbacks (
    id          uuid        PRIMARY KEY,
    secret_hash bytea       NOT NULL UNIQUE,
    job_id      uuid        NOT NULL REFERENCES evora.jobs (id) ON DELETE CASCADE,
    -- the attempt that suspended
    attempt     integer     NOT NULL,
    on_timeout  text        NOT NULL CONSTRAINT callbacks_on_timeout
                            CHECK (on_timeout IN ('fail', 'dlq', 'resume')),
    created_at  timestamptz NOT NULL,
    timeout_at  timestamptz NOT NULL,
    -- NULL while the job waits on it
    outcome     text        CONSTRAINT callbacks_outcome
                            CHECK (outcome IN ('resolved', 'timed_out', 'cancelled')),
    settled_at  timestamptz,
    payload     jsonb,
    CONSTRAINT callbacks_settled_iff_outcome CHECK ((outcome IS NULL) = (settled_at IS NULL))
);
-- the sweeper's timeouts, as jobs_running_lease serves lease expiry
CREATE INDEX callbacks_due ON evora.callbacks (timeout_at) WHERE outcome IS NULL;
-- the cascade from a pruned job, and a cancel settling its job's callback
CREATE INDEX callbacks_job ON evora.callbacks (job_id);

-- The job's current or last callback, as the job resource and the next attempt's claim show
-- it ({id, on_timeout, suspended_at, timeout_at, resolved_at, timed_out, payload}): on the
-- row, so a claim reads nothing more. NULL for a job that never suspended.
ALTER TABLE evora.jobs ADD COLUMN callback jsonb;

-- A suspended job keeps its FIFO group's turn (rules.sql, group_turn): the claims probe this
-- by the candidate's (queue, group), as they probe jobs_group_running.
CREATE INDEX jobs_group_suspended ON evora.jobs (queue, group_key)
    WHERE state = 'SUSPENDED' AND group_key IS NOT NULL;

INSERT INTO evora.job_transitions (from_state, to_state, event) VALUES
    ('RUNNING',   'SUSPENDED', 'suspended'),
    -- resolved, or timed out with on_timeout 'resume': handed back uncounted, like a release
    ('SUSPENDED', 'PENDING',   'resumed'),
    -- timed out with on_timeout 'fail' and attempts left: a failed attempt, retried
    ('SUSPENDED', 'PENDING',   'callback_timed_out'),
    -- timed out with on_timeout 'dlq', or 'fail' with no attempt left
    ('SUSPENDED', 'DLQ',       'dead_lettered'),
    ('SUSPENDED', 'CANCELLED', 'cancelled');
