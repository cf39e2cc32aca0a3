-- Evora schema, version 13: jobs that wait for other jobs (docs/dependencies.md).
--
-- A job submitted with unfinished dependencies is WAITING. Its readiness is decided by the
-- database in the transaction that finishes a dependency, by triggers on jobs: whichever
-- statement finishes a job (a worker's complete, a cancel, a discard from the DLQ, a lease
-- expiry) releases or cancels what waits on it, with no polling loop to miss it.
--
-- jobs.dependencies_left counts a WAITING job's dependencies not yet final (COMPLETED or
-- CANCELLED; a job in the DLQ may still be retried, so it keeps its dependents waiting).
-- Every final transition of a dependency decrements it under the dependent's row lock, so of
-- two dependencies finishing at once the second sees the first's decrement: exactly one of
-- them moves the dependent on, and neither can miss it.
--
-- jobs.depends_on lists a job's dependencies as submitted, for the job resource; the table
-- job_dependencies holds the same edges indexed by dependency, for the triggers.
--
-- jobs.has_dependents is set on a job when a dependent is submitted: it lets the triggers'
-- WHEN clauses pass over every job nothing waits on in C, without a function call. Setting
-- it is also the submission's lock on the dependency, so a dependency cannot finish between
-- the submission counting it unfinished and the submission's edge becoming visible.
--
-- ALTER TYPE ... ADD VALUE cannot be used in the transaction that adds it, so the runner
-- commits the statement before the `evora:commit` marker on its own (IF NOT EXISTS keeps it
-- re-runnable).

ALTER TYPE job_state ADD VALUE IF NOT EXISTS 'WAITING';

-- evora:commit

INSERT INTO job_transitions (from_state, to_state, event) VALUES
    (NULL,      'WAITING',   'submitted'),
    ('WAITING', 'PENDING',   'dependencies_met'),
    ('WAITING', 'CANCELLED', 'cancelled');

-- The legal pairs live in the guard's WHEN clause (version 6), regenerated from
-- job_transitions whenever it changes.
DO $$
DECLARE
    legal text;
BEGIN
    SELECT string_agg(DISTINCT format('(%L::job_state, %L::job_state)', from_state, to_state),
                      ', ')
    INTO legal
    FROM job_transitions
    WHERE from_state IS NOT NULL;

    DROP TRIGGER IF EXISTS jobs_transition_guard ON jobs;
    EXECUTE format(
        'CREATE TRIGGER jobs_transition_guard '
        'BEFORE UPDATE OF state ON jobs FOR EACH ROW '
        'WHEN (OLD.state IS DISTINCT FROM NEW.state AND (OLD.state, NEW.state) NOT IN (%s)) '
        'EXECUTE FUNCTION evora_reject_illegal_transition()',
        legal);
END
$$;

CREATE OR REPLACE FUNCTION evora_reject_illegal_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'a new job must be PENDING or WAITING, not %', NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    RAISE EXCEPTION 'illegal job transition % -> % (job %)', OLD.state, NEW.state, OLD.id
        USING ERRCODE = 'check_violation';
END
$$;

DROP TRIGGER jobs_new_state_guard ON jobs;
CREATE TRIGGER jobs_new_state_guard
    BEFORE INSERT ON jobs
    FOR EACH ROW WHEN (NEW.state NOT IN ('PENDING', 'WAITING'))
    EXECUTE FUNCTION evora_reject_illegal_transition();

-- A WAITING job is live: retention must never remove it.
DROP TRIGGER jobs_live_delete_guard ON jobs;
CREATE TRIGGER jobs_live_delete_guard
    BEFORE DELETE ON jobs
    FOR EACH ROW WHEN (OLD.state IN ('PENDING', 'RUNNING', 'WAITING'))
    EXECUTE FUNCTION evora_reject_live_delete();

-- Constant defaults: added without rewriting the table.
ALTER TABLE jobs
    ADD COLUMN on_dependency_failure text NOT NULL DEFAULT 'cancel'
        CONSTRAINT jobs_on_dependency_failure CHECK (on_dependency_failure IN ('cancel', 'run')),
    ADD COLUMN dependencies_left integer NOT NULL DEFAULT 0
        CONSTRAINT jobs_dependencies_left CHECK (dependencies_left >= 0),
    ADD COLUMN has_dependents boolean NOT NULL DEFAULT false,
    -- what the job resource shows (NULL: none); job_dependencies holds the same edges,
    -- indexed from the dependency's side
    ADD COLUMN depends_on uuid[],
    ADD CONSTRAINT jobs_waiting_has_dependencies
        CHECK (state <> 'WAITING' OR dependencies_left > 0);

-- One row per (dependent, dependency). The dependency is not a foreign key: it may be pruned
-- by retention once final, while its dependent's edge still says what it waited for.
CREATE TABLE job_dependencies (
    job_id     uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    depends_on uuid NOT NULL,
    PRIMARY KEY (job_id, depends_on),
    CONSTRAINT job_dependencies_not_self CHECK (job_id <> depends_on)
);

-- The dependents of a finishing job (the trigger) and GET /v1/jobs/{id}/dependents.
CREATE INDEX job_dependencies_dependents ON job_dependencies (depends_on, job_id);

-- What a WAITING dependent becomes when `arrived` of its dependencies have just ended
-- (COMPLETED or CANCELLED), one of them CANCELLED if `cancelled`: the one statement of the
-- readiness rule.
CREATE FUNCTION evora_dependent_next_state(j jobs, arrived integer, cancelled boolean)
RETURNS job_state
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN cancelled AND j.on_dependency_failure = 'cancel' THEN 'CANCELLED'::job_state
        WHEN j.dependencies_left <= arrived THEN 'PENDING'::job_state
        ELSE 'WAITING'::job_state
    END
$$;

-- What the jobs `ended_ids` (each now in its state of `ended_states`, COMPLETED or
-- CANCELLED) change below them: every WAITING job that waits on one of them, with the state
-- it moves to, how many of its dependencies ended (`arrived`) and, for one cancelled, the
-- CANCELLED dependency that cancels it (`cause`). A job cancelled so ends too: the jobs
-- waiting on it are in the answer as well, down the whole subtree.
CREATE FUNCTION evora_settlement(ended_ids uuid[], ended_states job_state[])
RETURNS TABLE (id uuid, state job_state, arrived integer, cause uuid)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE cancelled(id) AS (
        SELECT d.job_id
        FROM unnest(ended_ids, ended_states) AS e(id, state)
        JOIN job_dependencies d ON d.depends_on = e.id
        JOIN jobs w ON w.id = d.job_id
        WHERE e.state = 'CANCELLED' AND w.state = 'WAITING'
          AND evora_dependent_next_state(w, 0, true) = 'CANCELLED'
        UNION
        SELECT d.job_id
        FROM cancelled c
        JOIN job_dependencies d ON d.depends_on = c.id
        JOIN jobs w ON w.id = d.job_id
        WHERE w.state = 'WAITING' AND evora_dependent_next_state(w, 0, true) = 'CANCELLED'
    ),
    ended AS (
        SELECT e.id, e.state FROM unnest(ended_ids, ended_states) AS e(id, state)
        UNION ALL
        SELECT c.id, 'CANCELLED'::job_state FROM cancelled c
    ),
    arrivals AS (
        SELECT d.job_id AS id, count(*)::integer AS arrived,
               (array_agg(e.id ORDER BY e.id) FILTER (WHERE e.state = 'CANCELLED'))[1] AS cause
        FROM ended e
        JOIN job_dependencies d ON d.depends_on = e.id
        GROUP BY d.job_id
    )
    SELECT w.id, evora_dependent_next_state(w, a.arrived, a.cause IS NOT NULL), a.arrived,
           a.cause
    FROM arrivals a
    JOIN jobs w ON w.id = a.id
    WHERE w.state = 'WAITING'
$$;

-- Waiting jobs are settled once per statement, for every job it ended that others wait on,
-- whatever their number and order in the statement (an ack batch completes many): all the
-- waiting jobs that will change are locked first, in one global order (id), so two
-- transactions ending dependencies of the same jobs queue on the same first row instead of
-- deadlocking. (Settling row by row as each dependency ends would take the same rows in
-- different orders in two batches.) A statement with a fresh snapshot, which sees every
-- decrement committed before the locks were granted, then settles the whole subtree at once.
--
-- A BEFORE UPDATE row trigger notes each job the statement ends that others wait on, in a
-- setting local to the transaction; its WHEN clause passes over every other row in C. The
-- AFTER UPDATE statement trigger settles them; its WHEN clause passes over every statement
-- that noted none. (A statement trigger with transition tables would need no note, but
-- would make every update of jobs, heartbeats and claims included, pay for them.) While it
-- settles, `evora.settling` keeps the jobs it cancels from being noted: the settlement
-- already covered what waits on them.
CREATE FUNCTION evora_note_ended_dependency() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('evora.ended_dependencies',
                       coalesce(current_setting('evora.ended_dependencies', true), '')
                           || NEW.id || ',',
                       true);
    RETURN NEW;
END
$$;

CREATE FUNCTION evora_settle_dependents() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ended_ids uuid[];
    ended_states job_state[];
    hinted bigint;
BEGIN
    SELECT array_agg(j.id ORDER BY j.id), array_agg(j.state ORDER BY j.id)
    INTO ended_ids, ended_states
    FROM jobs j
    WHERE j.id = ANY(string_to_array(
        rtrim(current_setting('evora.ended_dependencies'), ','), ',')::uuid[]);
    PERFORM set_config('evora.ended_dependencies', '', true);

    PERFORM 1
    FROM jobs j
    WHERE j.id IN (SELECT s.id FROM evora_settlement(ended_ids, ended_states) s)
    ORDER BY j.id
    FOR UPDATE OF j;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;

    PERFORM set_config('evora.settling', 'on', true);
    WITH settled AS (
        UPDATE jobs j
        SET state = n.state,
            dependencies_left = CASE WHEN n.state = 'CANCELLED' THEN j.dependencies_left
                                     ELSE j.dependencies_left - n.arrived END,
            version = j.version + (n.state <> 'WAITING')::int,
            updated_at = CASE WHEN n.state <> 'WAITING' THEN evora_now() ELSE j.updated_at END,
            finished_at = CASE WHEN n.state = 'CANCELLED' THEN evora_now() END
        FROM evora_settlement(ended_ids, ended_states) n
        WHERE j.id = n.id AND j.state = 'WAITING'
        RETURNING j.*, n.cause, evora_job_image(j) AS image
    ),
    recorded AS (
        INSERT INTO job_events (job_id, job_version, queue, type, event, from_state, to_state,
                                attempt, worker_id, at, data, job)
        SELECT id, version, queue, type,
               CASE WHEN state = 'PENDING' THEN 'dependencies_met' ELSE 'cancelled' END,
               'WAITING', state, attempt, NULL, updated_at,
               CASE WHEN state = 'CANCELLED'
                    THEN jsonb_build_object('reason', 'dependency_cancelled',
                                            'dependency', cause)
                    ELSE '{}'::jsonb END,
               image
        FROM settled
        WHERE state <> 'WAITING'
    )
    -- The NOTIFY hint, as for any job that becomes PENDING (delivered at commit).
    SELECT count(pg_notify('evora_jobs', q.queue))
    INTO hinted
    FROM (SELECT DISTINCT queue FROM settled WHERE state = 'PENDING') q;
    PERFORM set_config('evora.settling', '', true);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_note_ended_dependency
    BEFORE UPDATE OF state ON jobs
    FOR EACH ROW
    WHEN (NEW.has_dependents AND NEW.state IN ('COMPLETED', 'CANCELLED')
          AND OLD.state IS DISTINCT FROM NEW.state
          AND current_setting('evora.settling', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION evora_note_ended_dependency();

CREATE TRIGGER jobs_settle_dependents
    AFTER UPDATE OF state ON jobs
    FOR EACH STATEMENT
    WHEN (current_setting('evora.ended_dependencies', true) <> '')
    EXECUTE FUNCTION evora_settle_dependents();

-- A submission's hold on the dependencies of the job it is about to store: locks them in id
-- order (racing submissions then cannot deadlock), marks them as having dependents, and
-- returns their current state, committed before the lock was granted. A dependency cannot
-- finish until the submission commits, and then its trigger sees the new edges.
CREATE FUNCTION evora_hold_dependencies(ids uuid[]) RETURNS TABLE (id uuid, state job_state)
LANGUAGE sql AS $$
    WITH held AS (
        SELECT x.id FROM jobs x WHERE x.id = ANY(ids) ORDER BY x.id FOR NO KEY UPDATE
    )
    UPDATE jobs j SET has_dependents = true
    FROM held h
    WHERE j.id = h.id
    RETURNING j.id, j.state
$$;

-- What evora.submit_rows() of version 11 did, with each item's dependencies: `dependency_ords`
-- and `dependency_ids` are its edges (the item's position, from 1, and the job it waits for,
-- in the item's depends_on order; a job of this same call may be named by its id), and
-- `on_failures` its on_dependency_failure (NULL: 'cancel'). An item with unfinished
-- dependencies is stored WAITING. Two more outcomes, for items not stored, with `first_ord`
-- the position (from 1) of the offending dependency in the item's list:
--   unknown_dependency    no such job (nor an item of this call)
--   cancelled_dependency  it is CANCELLED and the item would be cancelled with it
-- Dependencies can only be existing jobs or items of this call: a cycle cannot be written.
--
-- It has a name of its own, and evora.submit_rows() is dropped: migration 0011 is written to
-- be re-runnable and re-creates evora.submit_rows() with its own signature, which must then
-- not stand beside a second overload of the same name (a call with 0011's arguments would
-- match both).
DROP FUNCTION IF EXISTS evora.submit_rows(uuid[], text[], text[], jsonb[], smallint[],
                                          timestamptz[], float8[], integer[], integer[], float8[],
                                          float8[], float8[], timestamptz[], text[], text[],
                                          bytea[], text[]);

CREATE OR REPLACE FUNCTION evora.store_submissions(
    ids uuid[], queues text[], types text[], payloads jsonb[], priorities smallint[],
    run_ats timestamptz[], delays float8[], max_attempts integer[], leases integer[],
    backoff_initials float8[], backoff_maxes float8[], backoff_multipliers float8[],
    expires_ats timestamptz[], idempotency_keys text[], group_keys text[],
    before_0011 bytea[], quiet text[], dependency_ords integer[], dependency_ids uuid[],
    on_failures text[]
) RETURNS TABLE (ord integer, outcome text, first_ord integer, job jobs, notified text[],
                 owed text[])
LANGUAGE plpgsql AS $$
DECLARE
    made integer;
    -- of keyed items only: what a replay is compared by
    fingerprints bytea[];
    -- ids whose idempotency key this call stored
    kept uuid[];
    -- by item: the stored job it replays (its key was stored before with the same fields)
    replays uuid[];
    -- by edge, as dependency_ids: the job waited for, a replayed item standing for its job
    waited uuid[];
    -- by item: dependencies not final, and why it is refused (with the dependency's place)
    lefts integer[];
    refusals text[];
    culprits integer[];
BEGIN
    waited := dependency_ids;
    IF array_remove(idempotency_keys, NULL) <> '{}' THEN
        fingerprints := ARRAY(
            SELECT CASE WHEN x.key IS NOT NULL THEN evora.fingerprint(
                       x.queue, x.type, x.payload, x.priority, x.run_at, x.delay, x.max_attempts,
                       x.lease_seconds, x.backoff_initial, x.backoff_max, x.backoff_multiplier,
                       x.expires_at, x.group_key) END
            FROM unnest(queues, types, payloads, priorities, run_ats, delays, max_attempts, leases,
                        backoff_initials, backoff_maxes, backoff_multipliers, expires_ats,
                        idempotency_keys, group_keys)
                WITH ORDINALITY AS x(queue, type, payload, priority, run_at, delay, max_attempts,
                                     lease_seconds, backoff_initial, backoff_max,
                                     backoff_multiplier, expires_at, key, group_key, ord)
            ORDER BY x.ord);
        -- The keys first, before any dependency is counted: an item whose key replays a
        -- stored job is that job for the items naming it. A key repeated in this call is
        -- stored once, for its first appearance.
        WITH keyed AS (
            INSERT INTO idempotency_keys (queue, key, fingerprint, job_id)
            SELECT DISTINCT ON (x.queue, x.key) x.queue, x.key, fingerprints[x.ord], x.id
            FROM unnest(ids, queues, idempotency_keys) WITH ORDINALITY AS x(id, queue, key, ord)
            WHERE x.key IS NOT NULL
            ORDER BY x.queue, x.key, x.ord
            ON CONFLICT (queue, key) DO NOTHING
            RETURNING job_id
        )
        SELECT coalesce(array_agg(k.job_id), '{}') INTO kept FROM keyed k;
        -- A new statement, with a new snapshot: it sees the key of a racing submission that
        -- committed while the insert above waited for it.
        replays := ARRAY(
            SELECT CASE WHEN k.job_id <> x.id
                         AND k.fingerprint IN (fingerprints[x.ord], before_0011[x.ord])
                        THEN k.job_id END
            FROM unnest(ids, queues, idempotency_keys) WITH ORDINALITY AS x(id, queue, key, ord)
            LEFT JOIN idempotency_keys k ON k.queue = x.queue AND k.key = x.key
            ORDER BY x.ord);
        IF cardinality(dependency_ids) > 0 AND array_remove(replays, NULL) <> '{}' THEN
            waited := ARRAY(
                SELECT coalesce(r.job, u.dep)
                FROM unnest(dependency_ids) WITH ORDINALITY AS u(dep, n)
                LEFT JOIN unnest(ids, replays) AS r(id, job) ON r.id = u.dep
                ORDER BY u.n);
        END IF;
    END IF;
    IF cardinality(waited) > 0 THEN
        WITH held AS (
            SELECT * FROM evora_hold_dependencies(
                ARRAY(SELECT DISTINCT d FROM unnest(waited) d WHERE d <> ALL(ids)))
        ),
        edge AS (
            SELECT e.ord, row_number() OVER (PARTITION BY e.ord ORDER BY e.n) AS place,
                   e.dep = ANY(ids) AS in_call, h.state,
                   coalesce(on_failures[e.ord], 'cancel') AS policy
            -- a dependency named twice by one item counts once
            FROM (SELECT DISTINCT ON (u.ord, u.dep) u.*
                  FROM unnest(dependency_ords, waited) WITH ORDINALITY AS u(ord, dep, n)
                  ORDER BY u.ord, u.dep, u.n) AS e
            LEFT JOIN held h ON h.id = e.dep
        ),
        verdict AS (
            SELECT i.n,
                   (SELECT count(*) FROM edge e
                    WHERE e.ord = i.n
                      AND (e.in_call OR e.state NOT IN ('COMPLETED', 'CANCELLED')))::integer
                       AS left_count,
                   bad.refusal, bad.place
            FROM generate_series(1, cardinality(ids)) AS i(n)
            LEFT JOIN LATERAL (
                SELECT CASE WHEN e.state IS NULL THEN 'unknown_dependency'
                            ELSE 'cancelled_dependency' END AS refusal,
                       e.place::integer AS place
                FROM edge e
                WHERE e.ord = i.n AND NOT e.in_call
                  AND (e.state IS NULL OR (e.state = 'CANCELLED' AND e.policy = 'cancel'))
                ORDER BY e.place
                LIMIT 1
            ) bad ON true
        )
        SELECT array_agg(v.left_count ORDER BY v.n), array_agg(v.refusal ORDER BY v.n),
               array_agg(v.place ORDER BY v.n)
        INTO lefts, refusals, culprits
        FROM verdict v;
        -- A refused item is not stored: neither is its key.
        IF kept IS NOT NULL AND array_remove(refusals, NULL) <> '{}' THEN
            DELETE FROM idempotency_keys k
            USING unnest(ids, queues, idempotency_keys, refusals) AS x(id, queue, key, refusal)
            WHERE x.refusal IS NOT NULL AND k.queue = x.queue AND k.key = x.key
              AND k.job_id = x.id;
        END IF;
    END IF;
    -- The created items first, straight from the insert ...
    RETURN QUERY
    WITH lists AS (
        SELECT e.ord, array_agg(e.dep ORDER BY e.n) AS deps
        FROM (SELECT DISTINCT ON (u.ord, u.dep) u.*
              FROM unnest(dependency_ords, waited) WITH ORDINALITY AS u(ord, dep, n)
              ORDER BY u.ord, u.dep, u.n) AS e
        GROUP BY e.ord
    ),
    input AS (
        SELECT x.*, coalesce(lefts[x.ord], 0) AS waiting_on, l.deps
        FROM unnest(ids, queues, types, payloads, priorities, run_ats, delays, max_attempts,
                    leases, backoff_initials, backoff_maxes, backoff_multipliers,
                    expires_ats, idempotency_keys, group_keys)
            WITH ORDINALITY AS x(id, queue, type, payload, priority, run_at, delay,
                                 max_attempts, lease_seconds, backoff_initial, backoff_max,
                                 backoff_multiplier, expires_at, key, group_key, ord)
        LEFT JOIN lists l ON l.ord = x.ord
        WHERE refusals[x.ord] IS NULL
    ),
    moved AS (
        INSERT INTO jobs AS j (id, queue, type, payload, priority, run_at, max_attempts,
                               lease_seconds, backoff_initial, backoff_max, backoff_multiplier,
                               expires_at, idempotency_key, group_key, state, dependencies_left,
                               on_dependency_failure, has_dependents, depends_on)
        SELECT i.id, i.queue, i.type, i.payload, i.priority,
               coalesce(i.run_at, evora_now() + make_interval(secs => coalesce(i.delay, 0))),
               i.max_attempts, i.lease_seconds, i.backoff_initial, i.backoff_max,
               i.backoff_multiplier, i.expires_at, i.key, i.group_key,
               CASE WHEN i.waiting_on > 0 THEN 'WAITING' ELSE 'PENDING' END::job_state,
               i.waiting_on, coalesce(on_failures[i.ord], 'cancel'), i.id = ANY(waited),
               i.deps
        FROM input i
        WHERE i.key IS NULL OR i.id IN (SELECT unnest(kept))
        ORDER BY i.ord
        RETURNING j.*, j AS whole, evora_job_image(j) AS image
    ),
    edges AS (
        INSERT INTO job_dependencies (job_id, depends_on)
        SELECT m.id, d.dep
        FROM moved m
        CROSS JOIN LATERAL unnest(m.depends_on) AS d(dep)
    ),
    recorded AS (
        INSERT INTO job_events (job_id, job_version, queue, type, event, from_state, to_state,
                                attempt, worker_id, at, data, job)
        SELECT m.id, m.version, m.queue, m.type, 'submitted', NULL, m.state,
               m.attempt, NULL, m.updated_at, '{}', m.image
        FROM moved m
    ),
    claimable AS (
        SELECT DISTINCT m.queue AS q FROM moved m
        WHERE m.state = 'PENDING' OR m.group_key IS NOT NULL
    ),
    hinted AS (
        SELECT c.q, pg_notify('evora_jobs', c.q) AS sent FROM claimable c
        WHERE c.q <> ALL(quiet)
    )
    SELECT i.ord::integer, 'created'::text, NULL::integer, m.whole,
           (SELECT array_agg(h.q) FROM hinted h),
           (SELECT array_agg(c.q) FROM claimable c WHERE c.q = ANY(quiet))
    FROM moved m JOIN input i ON i.id = m.id;
    GET DIAGNOSTICS made = ROW_COUNT;
    IF made = cardinality(ids) THEN
        RETURN;
    END IF;
    -- ... then the refused ones ...
    RETURN QUERY
    SELECT x.ord::integer, refusals[x.ord], culprits[x.ord], NULL::jobs, NULL::text[],
           NULL::text[]
    FROM generate_series(1, cardinality(ids)) AS x(ord)
    WHERE refusals[x.ord] IS NOT NULL;
    -- ... then the others, by their key, stored before this call or by an earlier item of
    -- it. (An item whose key names its own id was created above.)
    RETURN QUERY
    SELECT x.ord::integer,
           CASE
               WHEN s.id IS NULL THEN 'gone'
               WHEN k.fingerprint IN (fingerprints[x.ord], before_0011[x.ord]) THEN 'replayed'
               WHEN k.job_id = ANY(ids) THEN 'repeat_conflict'
               ELSE 'conflict'
           END,
           array_position(ids, k.job_id),
           s,
           NULL::text[], NULL::text[]
    FROM unnest(ids, queues, idempotency_keys) WITH ORDINALITY AS x(id, queue, key, ord)
    LEFT JOIN idempotency_keys k ON k.queue = x.queue AND k.key = x.key
    LEFT JOIN jobs s ON s.id = k.job_id
    WHERE x.key IS NOT NULL AND k.job_id IS DISTINCT FROM x.id AND refusals[x.ord] IS NULL;
END
$$;

-- As every function of the evora schema: Evora's own search_path, nothing PUBLIC's.
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION evora.store_submissions(uuid[], text[], text[], jsonb[], smallint[], '
        'timestamptz[], float8[], integer[], integer[], float8[], float8[], float8[], '
        'timestamptz[], text[], text[], bytea[], text[], integer[], uuid[], text[]) '
        'SET search_path = %I, pg_temp', current_schema());
END
$$;
REVOKE ALL ON FUNCTION evora.store_submissions(uuid[], text[], text[], jsonb[], smallint[],
    timestamptz[], float8[], integer[], integer[], float8[], float8[], float8[], timestamptz[],
    text[], text[], bytea[], text[], integer[], uuid[], text[]) FROM PUBLIC;

-- The SQL submissions (evora.submit, evora.submit_batch) take the dependency fields as
-- POST /v1/jobs and POST /v1/jobs/batch do.

-- The limits of version 11 and those of dependencies; evora.protocol.limits holds the same
-- numbers (tests/sql/test_limits.py keeps them equal).
CREATE OR REPLACE FUNCTION evora.limits() RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT '{
        "queue_pattern": "^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$",
        "type_pattern": "^[A-Za-z0-9_.:-]{1,255}$",
        "key_max_length": 255,
        "max_payload_bytes": 1048576,
        "max_seconds": 315360000,
        "max_batch": 1000,
        "priority": {"min": -32768, "max": 32767, "default": 0},
        "max_attempts": {"min": 1, "max": 1000, "default": 5},
        "lease_seconds": {"min": 1, "max": 86400, "default": 30},
        "backoff": {"initial_seconds": 1.0, "max_seconds": 3600.0, "multiplier": 2.0,
                    "max_multiplier": 1000},
        "max_dependencies": 1000,
        "ref_pattern": "^[A-Za-z0-9_.:-]{1,255}$"
    }'::jsonb
$$;

-- A submission's dependency fields: depends_on as given (a job id in its canonical text
-- form, or "ref:<name>"), on_dependency_failure and ref. No table uses the type. Guarded, as
-- every statement of this migration on the schema evora (replaced, or IF EXISTS): that
-- schema outlives its tables' schema being dropped and migrated again, as 0011 says.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute
                   WHERE attrelid = 'evora.submission'::regclass AND attname = 'depends_on') THEN
        ALTER TYPE evora.submission
            ADD ATTRIBUTE depends_on text[],
            ADD ATTRIBUTE on_dependency_failure text,
            ADD ATTRIBUTE ref text;
    END IF;
END
$$;

-- One submission object checked field by field: evora.validated() of version 11 for its
-- fields, then the dependency fields. A "ref:" is resolved by evora.submit_items(), which
-- knows the items before this one.
CREATE OR REPLACE FUNCTION evora.validated_with_dependencies(item jsonb, at text)
RETURNS evora.submission
LANGUAGE plpgsql STABLE AS $$
DECLARE
    lim CONSTANT jsonb := evora.limits();
    s evora.submission;
    dep jsonb;
    place bigint;
    field text;
    given text;
BEGIN
    IF item IS NULL OR jsonb_typeof(item) <> 'object' THEN
        RETURN evora.validated(item, at);  -- which refuses it
    END IF;
    s := evora.validated(item - 'depends_on' - 'on_dependency_failure' - 'ref', at);
    s.ref := evora.text_field(item -> 'ref', at || 'ref', lim ->> 'ref_pattern', NULL, true);
    -- As in the api's model, these two may be left out but not null.
    s.on_dependency_failure := coalesce(item ->> 'on_dependency_failure', 'cancel');
    IF item ? 'on_dependency_failure'
            AND (jsonb_typeof(item -> 'on_dependency_failure') <> 'string'
                 OR s.on_dependency_failure NOT IN ('cancel', 'run')) THEN
        PERFORM evora.reject(at || 'on_dependency_failure', 'must be "cancel" or "run"');
    END IF;
    s.depends_on := '{}';
    IF NOT item ? 'depends_on' THEN
        RETURN s;
    END IF;
    IF jsonb_typeof(item -> 'depends_on') <> 'array' THEN
        PERFORM evora.reject(at || 'depends_on', 'must be a JSON array of job ids');
    END IF;
    IF jsonb_array_length(item -> 'depends_on') > (lim ->> 'max_dependencies')::integer THEN
        PERFORM evora.reject(at || 'depends_on', format(
            'names %s jobs; the limit is %s', jsonb_array_length(item -> 'depends_on'),
            lim ->> 'max_dependencies'));
    END IF;
    FOR dep, place IN SELECT * FROM jsonb_array_elements(item -> 'depends_on') WITH ORDINALITY
    LOOP
        field := format('%sdepends_on[%s]', at, place - 1);
        given := CASE WHEN jsonb_typeof(dep) = 'string' THEN dep #>> '{}' END;
        IF given ~ ('^ref:' || substr(lim ->> 'ref_pattern', 2)) THEN
            NULL;
        ELSIF given ~ '^[0-9A-Fa-f]{8}-([0-9A-Fa-f]{4}-){3}[0-9A-Fa-f]{12}$' THEN
            given := given::uuid::text;
        ELSE
            PERFORM evora.reject(field, 'must be a job id or "ref:<name>"');
        END IF;
        IF given = ANY(s.depends_on) THEN
            PERFORM evora.reject(field, 'names a job more than once');
        END IF;
        s.depends_on := s.depends_on || given;
    END LOOP;
    RETURN s;
END
$$;

-- evora.submit_items() of version 11 with dependencies: validates every item (all or
-- nothing), resolves each "ref:<name>" to the id of the earlier item that carries that ref
-- (only an earlier one: a batch cannot describe a cycle), stores them through
-- evora.store_submissions() and raises for the first item, in order, whose idempotency key
-- conflicts, whose job is gone or whose dependency names no job (or one CANCELLED that
-- would cancel it). The ids, in item order.
CREATE OR REPLACE FUNCTION evora.submit_items(items jsonb, batch boolean) RETURNS uuid[]
LANGUAGE plpgsql AS $$
DECLARE
    subs evora.submission[];
    new_ids uuid[];
    -- by ref: the id of the item carrying it
    named jsonb := '{}';
    edge_ords integer[] := '{}';
    edge_ids uuid[] := '{}';
    n integer;
    place integer;
    dep text;
    r record;
    at text;
    ids uuid[] := '{}';
BEGIN
    SELECT array_agg(evora.validated_with_dependencies(e.item,
               CASE WHEN batch THEN format('jobs[%s].', e.n - 1) ELSE '' END) ORDER BY e.n)
    INTO subs
    FROM jsonb_array_elements(items) WITH ORDINALITY AS e(item, n);
    new_ids := ARRAY(SELECT evora.uuid7() FROM generate_series(1, cardinality(subs)));
    FOR n IN 1 .. cardinality(subs) LOOP
        at := CASE WHEN batch THEN format('jobs[%s].', n - 1) ELSE '' END;
        FOR place IN 1 .. cardinality((subs[n]).depends_on) LOOP
            dep := (subs[n]).depends_on[place];
            IF dep LIKE 'ref:%' THEN
                IF NOT named ? substr(dep, 5) THEN
                    PERFORM evora.reject(format('%sdepends_on[%s]', at, place - 1),
                        format('%L names no earlier item of this batch', dep));
                END IF;
                dep := named ->> substr(dep, 5);
            END IF;
            edge_ords := edge_ords || n;
            edge_ids := edge_ids || dep::uuid;
        END LOOP;
        IF (subs[n]).ref IS NOT NULL THEN
            IF named ? (subs[n]).ref THEN
                PERFORM evora.reject(at || 'ref', format(
                    '%L is already the ref of an earlier item', (subs[n]).ref));
            END IF;
            named := named || jsonb_build_object((subs[n]).ref, new_ids[n]);
        END IF;
    END LOOP;
    FOR r IN
        SELECT * FROM evora.store_submissions(
            new_ids,
            ARRAY(SELECT (s).queue FROM unnest(subs) s),
            ARRAY(SELECT (s).type FROM unnest(subs) s),
            ARRAY(SELECT (s).payload FROM unnest(subs) s),
            ARRAY(SELECT (s).priority FROM unnest(subs) s),
            ARRAY(SELECT (s).run_at FROM unnest(subs) s),
            ARRAY(SELECT (s).delay_seconds FROM unnest(subs) s),
            ARRAY(SELECT (s).max_attempts FROM unnest(subs) s),
            ARRAY(SELECT (s).lease_seconds FROM unnest(subs) s),
            ARRAY(SELECT (s).backoff_initial FROM unnest(subs) s),
            ARRAY(SELECT (s).backoff_max FROM unnest(subs) s),
            ARRAY(SELECT (s).backoff_multiplier FROM unnest(subs) s),
            ARRAY(SELECT (s).expires_at FROM unnest(subs) s),
            ARRAY(SELECT (s).idempotency_key FROM unnest(subs) s),
            ARRAY(SELECT (s).group_key FROM unnest(subs) s),
            '{}', '{}', edge_ords, edge_ids,
            ARRAY(SELECT (s).on_dependency_failure FROM unnest(subs) s))
        ORDER BY ord
    LOOP
        at := CASE WHEN batch THEN format('jobs[%s].', r.ord - 1) ELSE '' END;
        IF r.outcome IN ('conflict', 'repeat_conflict') THEN
            RAISE EXCEPTION '%', CASE r.outcome
                WHEN 'conflict' THEN format(
                    '%sidempotency_key: %L was already used in queue %L with different fields',
                    at, (subs[r.ord]).idempotency_key, (subs[r.ord]).queue)
                ELSE format('%sidempotency_key: reuses the idempotency key of jobs[%s] with '
                            'different fields', at, r.first_ord - 1) END
                USING ERRCODE = 'unique_violation', COLUMN = 'idempotency_key',
                      CONSTRAINT = 'evora_idempotency_conflict';
        ELSIF r.outcome = 'gone' THEN
            RAISE EXCEPTION '%idempotency_key: % was used in queue % by a job that has since '
                            'been removed', at, quote_literal((subs[r.ord]).idempotency_key),
                            quote_literal((subs[r.ord]).queue)
                USING ERRCODE = 'unique_violation', COLUMN = 'idempotency_key',
                      CONSTRAINT = 'evora_idempotent_job_gone';
        ELSIF r.outcome = 'unknown_dependency' THEN
            PERFORM evora.reject(format('%sdepends_on[%s]', at, r.first_ord - 1), format(
                '%s names no job', (subs[r.ord]).depends_on[r.first_ord]));
        ELSIF r.outcome = 'cancelled_dependency' THEN
            PERFORM evora.reject(format('%sdepends_on[%s]', at, r.first_ord - 1), format(
                '%s names a CANCELLED job (with on_dependency_failure "cancel" this job '
                'could never run)', (subs[r.ord]).depends_on[r.first_ord]));
        END IF;
        ids := ids || (r.job).id;
    END LOOP;
    RETURN ids;
END
$$;

REVOKE ALL ON FUNCTION evora.validated_with_dependencies(jsonb, text) FROM PUBLIC;
