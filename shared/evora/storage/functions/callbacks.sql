-- Callbacks (docs/callbacks.md): a running job suspends itself until an external system
-- resolves its callback, or the callback's timeout passes. The table is migration 0040's.
--
-- The current text of this area's functions and triggers: edit them here. `evora migrate`
-- runs the file again whole, so every statement is re-runnable (CONTRIBUTING.md says how).
-- This file runs before claims_and_transitions.sql, whose functions the bodies below call:
-- they are PL/pgSQL, resolved when they run.
--
-- Every change of a callback is made under its job's row lock, taken first (suspend, resolve,
-- the sweep's timeout, cancel): one lock order, and a resolution, a timeout and a cancel of
-- the same callback are serialised by it, the later one seeing what the earlier committed.

-- The credential is the callback id handed to the suspending worker; the database keeps only
-- its SHA-256, as a password reset token is kept: what reads the tables cannot resolve.
CREATE OR REPLACE FUNCTION evora.callback_secret_hash(secret text) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT sha256(convert_to(secret, 'UTF8'))
$$;

-- What a resolution answers, the first time and every time after: the same object.
CREATE OR REPLACE FUNCTION evora.callback_resolution(c evora.callbacks) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('callback', c.id, 'job_id', c.job_id, 'resolved_at', c.settled_at,
                              'payload', c.payload)
$$;

-- Suspends the RUNNING job `job_id` held under `lease_token` on a new callback that times out
-- `timeout_seconds` from now (then `on_timeout`: 'fail', 'dlq' or 'resume'). The job keeps
-- its attempt number (the attempt is still running, only not on a worker): it holds no lease
-- (lease_expires_at NULL), and, no longer RUNNING, no limit slot; it keeps its FIFO group's
-- turn (rules.sql). One row: the outcome ('done', 'lease_lost', 'not_found'), the job, and the
-- callback id (the credential: 64 hex digits of two random UUIDs, 244 random bits from
-- PostgreSQL's strong random source). A cancel requested wins, as for a snooze: the attempt
-- ends CANCELLED and no callback is made.
CREATE OR REPLACE FUNCTION evora.suspend_job(
    job_id uuid, lease_token uuid, timeout_seconds float8, on_timeout text, suppressed text[]
) RETURNS TABLE (outcome text, job evora.jobs, callback_secret text, notified text[], owed text[])
LANGUAGE plpgsql VOLATILE ROWS 1 AS $$
DECLARE
    at CONSTANT timestamptz := evora.clock_now();
    deadline CONSTANT timestamptz := at + make_interval(secs => timeout_seconds);
    cb_id CONSTANT uuid := gen_random_uuid();
    secret text;
    j evora.jobs;
BEGIN
    -- The fence's state from a materialized CTE, as in the `heartbeat` statement (the
    -- reason is there; a variable would be a constant in a custom plan).
    WITH fence AS MATERIALIZED (SELECT 'RUNNING'::evora.job_state AS state)
    SELECT x.* INTO j FROM evora.jobs x, fence f
    WHERE x.id = suspend_job.job_id AND x.lease_token = suspend_job.lease_token
      AND x.state = f.state
    FOR UPDATE OF x;
    IF NOT FOUND THEN
        RETURN QUERY SELECT CASE WHEN EXISTS (SELECT 1 FROM evora.jobs x
                                              WHERE x.id = suspend_job.job_id)
                                 THEN 'lease_lost' ELSE 'not_found' END,
                            NULL::evora.jobs, NULL::text, NULL::text[], NULL::text[];
        RETURN;
    END IF;
    IF j.cancel_requested THEN
        RETURN QUERY SELECT 'done', e.job, NULL::text, e.notified, e.owed
        FROM evora.end_attempts(ARRAY[ROW(j.id, 'CANCELLED', NULL, 'cancel_requested', 0, false,
                                          'released', j.worker_id)::evora.attempt_end],
                                suppressed) AS e;
        RETURN;
    END IF;
    secret := 'evcb_' || encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()), 'hex');
    INSERT INTO evora.callbacks (id, secret_hash, job_id, attempt, on_timeout, created_at, timeout_at)
    VALUES (cb_id, evora.callback_secret_hash(secret), j.id, j.attempt, suspend_job.on_timeout,
            at, deadline);
    UPDATE evora.jobs x
    SET state = 'SUSPENDED', lease_expires_at = NULL, updated_at = at, version = x.version + 1,
        callback = jsonb_build_object('id', cb_id, 'on_timeout', suspend_job.on_timeout,
                                      'suspended_at', at, 'timeout_at', deadline,
                                      'resolved_at', NULL, 'timed_out', false, 'payload', NULL)
    WHERE x.id = j.id
    RETURNING x.* INTO j;
    RETURN QUERY SELECT 'done', j, secret, r.notified, r.owed
    FROM evora.record_moves(
        ARRAY[ROW(j, 'suspended', 'RUNNING', j.worker_id,
                  jsonb_build_object('callback', cb_id, 'timeout_at', deadline,
                                     'on_timeout', suspend_job.on_timeout))::evora.move],
        suppressed) AS r;
END
$$;

-- Settles the open callback `cb` of the SUSPENDED job `j` (the caller holds the job's lock and
-- read both after taking it) and moves the job out of SUSPENDED; returns the move for the
-- caller to record (evora.record_moves). `how`: 'resolved' (with `payload`) or 'timed_out'.
-- Resolved, or timed out with on_timeout 'resume': PENDING now, event `resumed`, the attempt
-- handed back uncounted like a release (the next claim runs the same attempt number, so
-- waiting uses up no attempt). Timed out with 'fail': a failed attempt, retried after the
-- job's backoff (`callback_timed_out`) or, with no attempt left, dead-lettered; with 'dlq':
-- dead-lettered. The job's `callback` gets the outcome the next attempt sees.
CREATE OR REPLACE FUNCTION evora.settle_suspended(
    j evora.jobs, cb evora.callbacks, how text, payload jsonb
) RETURNS evora.move
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at CONSTANT timestamptz := evora.clock_now();
    timed_out CONSTANT boolean := how = 'timed_out';
    resumed CONSTANT boolean := NOT timed_out OR cb.on_timeout = 'resume';
    to_dlq CONSTANT boolean := NOT resumed AND (cb.on_timeout = 'dlq' OR j.attempt >= j.max_attempts);
    error CONSTANT jsonb := CASE WHEN NOT resumed THEN jsonb_build_object(
        'message', 'the callback was not resolved before its timeout',
        'type', 'callback_timed_out') END;
    moved evora.jobs;
BEGIN
    UPDATE evora.callbacks c
    SET outcome = how, settled_at = at, payload = settle_suspended.payload
    WHERE c.id = cb.id;
    UPDATE evora.jobs x
    SET state = CASE WHEN to_dlq THEN 'DLQ' ELSE 'PENDING' END::evora.job_state,
        attempt = x.attempt - CASE WHEN resumed THEN 1 ELSE 0 END,
        callback = x.callback || jsonb_build_object(
            'resolved_at', CASE WHEN timed_out THEN NULL ELSE at END,
            'timed_out', timed_out, 'payload', settle_suspended.payload),
        last_error = coalesce(error, x.last_error),
        run_at = CASE WHEN resumed THEN at
                      WHEN to_dlq THEN x.run_at
                      ELSE at + make_interval(secs => evora.backoff_seconds(
                          x.backoff_initial, x.backoff_max, x.backoff_multiplier, x.attempt)) END,
        finished_at = CASE WHEN to_dlq THEN at END,
        updated_at = at, version = x.version + 1
    WHERE x.id = j.id AND x.state = 'SUSPENDED'
    RETURNING x.* INTO moved;
    RETURN ROW(moved,
               CASE WHEN resumed THEN 'resumed' WHEN to_dlq THEN 'dead_lettered'
                    ELSE 'callback_timed_out' END,
               'SUSPENDED', NULL,
               jsonb_strip_nulls(jsonb_build_object(
                   'callback', cb.id, 'timed_out', CASE WHEN timed_out THEN true END,
                   'reason', CASE WHEN to_dlq THEN 'callback_timed_out' END,
                   'error', error,
                   'retry_at', CASE WHEN NOT resumed AND NOT to_dlq THEN moved.run_at END))
              )::evora.move;
END
$$;

-- Resolves a callback with `payload`: named by its callback id (`secret`, a webhook sender's
-- credential) or, for an admin (the dashboard's approval), by the job waiting on it
-- (`of_job`). The HTTP resolve and evora.resolve_callback() both run this, so the rules are
-- one. One row: the outcome, the resolution, the job and the queues notified and owed.
--   'done'      resolved now: the job is PENDING again and its next attempt sees the payload
--   'replayed'  resolved before: answered with that first resolution, whatever the payload
--   'timed_out' its timeout passed (settled by the sweeper or not yet): nothing changes
--   'cancelled' its job was cancelled while it waited
--   'not_found' no such callback (or its job was pruned), or the job waits on none
-- The job's row lock is taken before the callback is read again: a concurrent resolution,
-- timeout or cancel that holds it commits first and is seen (each statement of a PL/pgSQL
-- function takes a new snapshot), so of two racing resolutions one resolves and the other
-- replays it, and a resolution racing the timeout's sweep either wins or is 'timed_out'.
CREATE OR REPLACE FUNCTION evora.resolve_callback_item(
    secret text, of_job uuid, payload jsonb, suppressed text[]
) RETURNS TABLE (outcome text, resolution jsonb, job evora.jobs, notified text[], owed text[])
LANGUAGE plpgsql VOLATILE ROWS 1 AS $$
DECLARE
    cb evora.callbacks;
    j evora.jobs;
    move evora.move;
BEGIN
    IF secret IS NOT NULL THEN
        SELECT c.* INTO cb FROM evora.callbacks c
        WHERE c.secret_hash = evora.callback_secret_hash(secret);
    ELSE
        SELECT c.* INTO cb FROM evora.jobs x
        JOIN evora.callbacks c ON c.id = (x.callback ->> 'id')::uuid
        WHERE x.id = of_job;
    END IF;
    IF FOUND THEN
        SELECT x.* INTO j FROM evora.jobs x WHERE x.id = cb.job_id FOR UPDATE;
        SELECT c.* INTO cb FROM evora.callbacks c WHERE c.id = cb.id;
    END IF;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found', NULL::jsonb, NULL::evora.jobs, NULL::text[], NULL::text[];
    ELSIF cb.outcome = 'resolved' THEN
        RETURN QUERY SELECT 'replayed', evora.callback_resolution(cb), j, NULL::text[], NULL::text[];
    ELSIF cb.outcome IS NOT NULL OR cb.timeout_at <= evora.clock_now() THEN
        RETURN QUERY SELECT coalesce(cb.outcome, 'timed_out'), NULL::jsonb, j, NULL::text[],
                            NULL::text[];
    ELSE
        move := evora.settle_suspended(j, cb, 'resolved', payload);
        SELECT c.* INTO cb FROM evora.callbacks c WHERE c.id = cb.id;
        RETURN QUERY SELECT 'done', evora.callback_resolution(cb), move.job, r.notified, r.owed
        FROM evora.record_moves(ARRAY[move], suppressed) AS r;
    END IF;
END
$$;

-- The sweeper: up to `batch` SUSPENDED jobs whose callback timed out, settled by their
-- on_timeout (evora.settle_suspended()). SKIP LOCKED passes over a job a resolution or cancel
-- holds; under the job's lock its callback is read again, so one resolved (or a newer one the
-- job suspended on since) meanwhile is left alone. Each moved job, with the queues notified
-- and owed.
CREATE OR REPLACE FUNCTION evora.expire_callbacks(batch integer, suppressed text[])
RETURNS TABLE (job evora.jobs, notified text[], owed text[])
LANGUAGE plpgsql VOLATILE ROWS 100 AS $$
DECLARE
    j evora.jobs;
    cb evora.callbacks;
    moves evora.move[] := '{}';
BEGIN
    FOR j IN
        SELECT x.* FROM evora.callbacks c JOIN evora.jobs x ON x.id = c.job_id
        WHERE c.outcome IS NULL AND c.timeout_at <= evora.clock_now() AND x.state = 'SUSPENDED'
        ORDER BY c.timeout_at
        LIMIT batch
        FOR UPDATE OF x SKIP LOCKED
    LOOP
        SELECT c.* INTO cb FROM evora.callbacks c WHERE c.job_id = j.id AND c.outcome IS NULL;
        CONTINUE WHEN NOT FOUND OR cb.timeout_at > evora.clock_now();
        moves := moves || evora.settle_suspended(j, cb, 'timed_out', NULL);
    END LOOP;
    RETURN QUERY SELECT (m.job), r.notified, r.owed
    FROM unnest(moves) AS m CROSS JOIN evora.record_moves(moves, suppressed) AS r;
END
$$;

-- Resolving a callback in SQL, for an application with database access (a webhook handler
-- writing its own data in the same transaction): the HTTP resolve's rules
-- (evora.resolve_callback_item()), its payload bounded as the HTTP body's is
-- (evora.client_json()). Returns the resolution, the first one's for a repeat; raises EV404
-- for an unknown callback and EV409 for one that timed out or whose job was cancelled.
CREATE OR REPLACE FUNCTION evora.resolve_callback(callback_id text, payload jsonb DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = evora, pg_temp AS $$
DECLARE
    answer text;
    resolved jsonb;
BEGIN
    SELECT r.outcome, r.resolution INTO answer, resolved
    FROM evora.resolve_callback_item(callback_id, NULL,
                                     evora.client_json(coalesce(payload, 'null'::jsonb), 'payload'),
                                     '{}') AS r;
    IF answer = 'not_found' THEN
        RAISE EXCEPTION 'callback not found' USING ERRCODE = 'EV404';
    ELSIF answer NOT IN ('done', 'replayed') THEN
        RAISE EXCEPTION 'the callback can no longer be resolved: %',
            CASE WHEN answer = 'timed_out' THEN 'it timed out' ELSE 'its job was cancelled' END
            USING ERRCODE = 'EV409';
    END IF;
    RETURN resolved;
END
$$;

REVOKE ALL ON FUNCTION evora.callback_secret_hash(text),
    evora.callback_resolution(evora.callbacks),
    evora.suspend_job(uuid, uuid, float8, text, text[]),
    evora.settle_suspended(evora.jobs, evora.callbacks, text, jsonb),
    evora.resolve_callback_item(text, uuid, jsonb, text[]),
    evora.expire_callbacks(integer, text[]),
    evora.resolve_callback(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION evora.resolve_callback(text, jsonb) TO evora_worker;
