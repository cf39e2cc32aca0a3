-- Evora schema, version 1.
--
-- jobs        current state of every job (the hot table; finished rows are pruned by the sweeper)
-- job_events  append-only outbox, one row per state change or cancel request, written in the
--             same statement as the change; tailed gap-free by (xid, seq)
-- The state machine lives in job_transitions and is enforced by a trigger on jobs, so an
-- illegal transition fails whoever issues the SQL.

CREATE TYPE job_state AS ENUM ('PENDING', 'RUNNING', 'COMPLETED', 'DLQ', 'CANCELLED');

CREATE TABLE job_transitions (
    from_state job_state,          -- NULL: a new job
    to_state   job_state NOT NULL,
    event      text      NOT NULL,
    UNIQUE (from_state, to_state, event)
);

INSERT INTO job_transitions (from_state, to_state, event) VALUES
    (NULL,        'PENDING',   'submitted'),
    ('PENDING',   'RUNNING',   'claimed'),
    ('PENDING',   'CANCELLED', 'cancelled'),
    ('PENDING',   'DLQ',       'dead_lettered'),
    ('RUNNING',   'COMPLETED', 'completed'),
    ('RUNNING',   'PENDING',   'failed'),
    ('RUNNING',   'PENDING',   'lease_expired'),
    ('RUNNING',   'PENDING',   'released'),
    ('RUNNING',   'DLQ',       'dead_lettered'),
    ('RUNNING',   'CANCELLED', 'cancelled'),
    ('DLQ',       'PENDING',   'retried'),
    ('DLQ',       'CANCELLED', 'cancelled');

CREATE TABLE jobs (
    id                 uuid PRIMARY KEY,
    -- submission order: the last tie-breaker of claim order and the keyset of listings
    submit_seq         bigint GENERATED ALWAYS AS IDENTITY,
    queue              text        NOT NULL,
    type               text        NOT NULL,
    payload            jsonb       NOT NULL,
    state              job_state   NOT NULL DEFAULT 'PENDING',
    priority           smallint    NOT NULL DEFAULT 0,
    group_key          text,
    idempotency_key    text,
    attempt            integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts       integer     NOT NULL CHECK (max_attempts BETWEEN 1 AND 1000),
    lease_seconds      integer     NOT NULL CHECK (lease_seconds BETWEEN 1 AND 86400),
    backoff_initial    float8      NOT NULL CHECK (backoff_initial > 0),
    backoff_max        float8      NOT NULL CHECK (backoff_max >= backoff_initial),
    backoff_multiplier float8      NOT NULL CHECK (backoff_multiplier >= 1),
    run_at             timestamptz NOT NULL,
    expires_at         timestamptz,
    lease_token        uuid,
    lease_expires_at   timestamptz,
    worker_id          text,
    cancel_requested   boolean     NOT NULL DEFAULT false,
    result             jsonb,
    last_error         jsonb,
    progress           jsonb,
    -- bumped by every change that writes an event; the event carries it
    version            integer     NOT NULL DEFAULT 1,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    started_at         timestamptz,
    finished_at        timestamptz,
    CONSTRAINT jobs_running_has_lease
        CHECK (state <> 'RUNNING' OR (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)),
    CONSTRAINT jobs_finished_at_iff_done
        CHECK ((state IN ('COMPLETED', 'CANCELLED', 'DLQ')) = (finished_at IS NOT NULL)),
    CONSTRAINT jobs_cancel_request_only_while_running
        CHECK (NOT cancel_requested OR state IN ('RUNNING', 'CANCELLED', 'COMPLETED'))
);

-- Jobs churn: vacuum early so dead tuples never pile up under the claim indexes.
ALTER TABLE jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02
);

CREATE UNIQUE INDEX jobs_submit_seq ON jobs (submit_seq);
-- claim order within a queue
CREATE INDEX jobs_claimable ON jobs (queue, priority, run_at, submit_seq)
    WHERE state = 'PENDING';
-- the head of each FIFO group
CREATE INDEX jobs_group_pending ON jobs (queue, group_key, priority, submit_seq)
    WHERE state = 'PENDING' AND group_key IS NOT NULL;
-- at most one RUNNING job per (queue, group), whatever SQL runs
CREATE UNIQUE INDEX jobs_group_running ON jobs (queue, group_key)
    WHERE state = 'RUNNING' AND group_key IS NOT NULL;
-- the next delayed job per queue (dispatcher timers)
CREATE INDEX jobs_scheduled ON jobs (queue, run_at) WHERE state = 'PENDING';
CREATE INDEX jobs_running_lease ON jobs (lease_expires_at) WHERE state = 'RUNNING';
CREATE INDEX jobs_pending_ttl ON jobs (expires_at)
    WHERE state = 'PENDING' AND expires_at IS NOT NULL;
CREATE INDEX jobs_finished ON jobs (finished_at)
    WHERE state IN ('COMPLETED', 'CANCELLED', 'DLQ');
CREATE INDEX jobs_listing ON jobs (queue, state, submit_seq);

CREATE FUNCTION evora_reject_illegal_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'a new job must be PENDING, not %', NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM job_transitions t
        WHERE t.from_state = OLD.state AND t.to_state = NEW.state
    ) THEN
        RAISE EXCEPTION 'illegal job transition % -> % (job %)', OLD.state, NEW.state, OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

-- The WHEN clauses keep the common path (legal inserts, updates that keep the state) in C.
CREATE TRIGGER jobs_new_state_guard
    BEFORE INSERT ON jobs
    FOR EACH ROW WHEN (NEW.state <> 'PENDING')
    EXECUTE FUNCTION evora_reject_illegal_transition();

CREATE TRIGGER jobs_transition_guard
    BEFORE UPDATE OF state ON jobs
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION evora_reject_illegal_transition();

CREATE FUNCTION evora_reject_live_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'job % is % and may not be deleted', OLD.id, OLD.state
        USING ERRCODE = 'check_violation';
END
$$;

-- Once accepted, a job is never lost: only finished jobs may be pruned.
CREATE TRIGGER jobs_live_delete_guard
    BEFORE DELETE ON jobs
    FOR EACH ROW WHEN (OLD.state IN ('PENDING', 'RUNNING'))
    EXECUTE FUNCTION evora_reject_live_delete();

CREATE TABLE job_events (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- the writing transaction; the outbox is read below the oldest running xid, so a
    -- transaction that took a lower seq but commits later is never skipped
    xid         xid8        NOT NULL DEFAULT pg_current_xact_id(),
    job_id      uuid        NOT NULL,
    job_version integer     NOT NULL,
    queue       text        NOT NULL,
    type        text        NOT NULL,
    event       text        NOT NULL,
    from_state  job_state,
    to_state    job_state   NOT NULL,
    attempt     integer     NOT NULL,
    worker_id   text,
    at          timestamptz NOT NULL,
    data        jsonb       NOT NULL DEFAULT '{}',
    -- the job row after the change (without payload and result), for projections
    job         jsonb       NOT NULL,
    CONSTRAINT job_events_version_once UNIQUE (job_id, job_version)
);

CREATE INDEX job_events_tail ON job_events (xid, seq);

CREATE FUNCTION evora_reject_event_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'job_events is append-only (% rejected)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE TRIGGER job_events_append_only
    BEFORE UPDATE OR DELETE ON job_events
    FOR EACH STATEMENT EXECUTE FUNCTION evora_reject_event_change();

CREATE TRIGGER job_events_no_truncate
    BEFORE TRUNCATE ON job_events
    FOR EACH STATEMENT EXECUTE FUNCTION evora_reject_event_change();

-- The image of a job that events carry: everything a projection needs, nothing large.
CREATE FUNCTION evora_job_image(j jobs) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', j.id, 'queue', j.queue, 'type', j.type, 'state', j.state,
        'priority', j.priority, 'group_key', j.group_key, 'idempotency_key', j.idempotency_key,
        'attempt', j.attempt, 'max_attempts', j.max_attempts, 'lease_seconds', j.lease_seconds,
        'run_at', j.run_at, 'expires_at', j.expires_at, 'lease_expires_at', j.lease_expires_at,
        'worker_id', j.worker_id, 'cancel_requested', j.cancel_requested,
        'last_error', j.last_error, 'version', j.version, 'submit_seq', j.submit_seq,
        'created_at', j.created_at, 'updated_at', j.updated_at,
        'started_at', j.started_at, 'finished_at', j.finished_at)
$$;

-- Retry n waits about initial * multiplier^(n-1), jittered by +-20 %, never above max.
-- Computed in log space so huge attempt counts cannot overflow.
CREATE FUNCTION evora_backoff_seconds(
    initial float8, max_seconds float8, multiplier float8, n integer
) RETURNS float8
LANGUAGE sql VOLATILE AS $$
    SELECT least(
        max_seconds,
        exp(least(ln(initial) + greatest(n - 1, 0) * ln(multiplier), ln(max_seconds) + 1))
            * (0.8 + 0.4 * random()))
$$;

CREATE TABLE paused_queues (
    queue     text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);

-- Outlives the job it names, so a key stays spent after its job is pruned.
CREATE TABLE idempotency_keys (
    queue       text        NOT NULL,
    key         text        NOT NULL,
    fingerprint bytea       NOT NULL,
    job_id      uuid        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, key)
);

CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);
