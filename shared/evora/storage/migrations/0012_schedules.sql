-- Schedules: cron-style periodic jobs (docs/schedules.md).
--
-- Every sweeper replica runs the scheduler. It takes a due row FOR UPDATE SKIP LOCKED and,
-- in the same transaction, submits the tick's job (idempotency key
-- `schedule:<name>:<tick>`) and moves `ticked_until` past the tick, so however many
-- replicas run and wherever one dies, a tick is handled by exactly one commit.

CREATE TABLE schedules (
    name                  text        PRIMARY KEY,
    cron                  text        NOT NULL,
    timezone              text        NOT NULL,
    -- the submission every tick makes (without idempotency_key: the tick names the key)
    job                   jsonb       NOT NULL,
    misfire               text        NOT NULL
        CHECK (misfire IN ('skip', 'run_once', 'catch_up')),
    -- a tick handled later than this is missed, and its policy decides
    misfire_grace_seconds integer     NOT NULL CHECK (misfire_grace_seconds > 0),
    paused                boolean     NOT NULL DEFAULT false,
    -- every tick at or before this was handled: its job made, or missed by the policy
    ticked_until          timestamptz NOT NULL,
    -- the first tick after ticked_until (NULL: the expression names no further instant)
    next_run_at           timestamptz,
    -- when the schedule last made a job (a tick, or a trigger) and which job
    last_run_at           timestamptz,
    last_job_id           uuid,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX schedules_due ON schedules (next_run_at) WHERE NOT paused;

-- The `submitted` event of a job made by a schedule names the schedule and the tick. The
-- scheduler sets `evora.submitted_data` (a JSON object, transaction-local) before it
-- submits, so the submission itself stays the one every producer uses; the setting is
-- empty or absent everywhere else, and the WHEN clause keeps those inserts off PL/pgSQL.
CREATE FUNCTION evora_add_submitted_data() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.data := NEW.data || current_setting('evora.submitted_data')::jsonb;
    RETURN NEW;
END
$$;

CREATE TRIGGER job_events_submitted_data
    BEFORE INSERT ON job_events
    FOR EACH ROW
    WHEN (NEW.event = 'submitted' AND current_setting('evora.submitted_data', true) <> '')
    EXECUTE FUNCTION evora_add_submitted_data();
