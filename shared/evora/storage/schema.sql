-- The schema that shared/evora/storage/migrations/ and functions/ build, as pg_dump prints it
-- (normalised: no comments, no session settings; the functions' comments are in functions/).
-- Never edit by hand: a test compares it with a freshly migrated database; after adding a
-- migration or changing a function file, regenerate it with
--     python -m tests.schemadump

CREATE SCHEMA evora;

CREATE TYPE evora.job_state AS ENUM (
    'PENDING',
    'RUNNING',
    'COMPLETED',
    'DLQ',
    'CANCELLED',
    'WAITING',
    'SUSPENDED'
);

CREATE TYPE evora.attempt_end AS (
	id uuid,
	to_state evora.job_state,
	error jsonb,
	reason text,
	delay double precision,
	released boolean,
	pending_event text,
	worker text
);

CREATE TYPE evora.claim_candidate AS (
	id uuid,
	priority smallint,
	run_at timestamp with time zone,
	submit_seq bigint,
	keys text[],
	lane text,
	fair_rank integer
);

CREATE TYPE evora.job_image AS (
	id uuid,
	queue text,
	type text,
	state evora.job_state,
	priority smallint,
	group_key text,
	idempotency_key text,
	attempt integer,
	max_attempts integer,
	lease_seconds integer,
	run_at timestamp with time zone,
	expires_at timestamp with time zone,
	lease_expires_at timestamp with time zone,
	worker_id text,
	cancel_requested boolean,
	last_error jsonb,
	version integer,
	submit_seq bigint,
	created_at timestamp with time zone,
	updated_at timestamp with time zone,
	started_at timestamp with time zone,
	finished_at timestamp with time zone
);

CREATE FUNCTION evora.clock_now() RETURNS timestamp with time zone
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT now() + coalesce(nullif(current_setting('evora.clock_offset', true), '')::interval,
                            interval '0')
$$;

CREATE TABLE evora.jobs (
    id uuid NOT NULL,
    submit_seq bigint NOT NULL,
    queue text NOT NULL,
    type text NOT NULL,
    payload jsonb NOT NULL,
    state evora.job_state DEFAULT 'PENDING'::evora.job_state NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    group_key text,
    idempotency_key text,
    attempt integer DEFAULT 0 NOT NULL,
    max_attempts integer NOT NULL,
    lease_seconds integer NOT NULL,
    backoff_initial double precision,
    backoff_max double precision,
    backoff_multiplier double precision,
    run_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone,
    lease_token uuid,
    lease_expires_at timestamp with time zone,
    worker_id text,
    cancel_requested boolean DEFAULT false NOT NULL,
    result jsonb,
    last_error jsonb,
    progress jsonb,
    version integer DEFAULT 1 NOT NULL,
    created_at timestamp with time zone DEFAULT evora.clock_now() NOT NULL,
    updated_at timestamp with time zone DEFAULT evora.clock_now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    on_dependency_failure text,
    dependencies_left integer DEFAULT 0 NOT NULL,
    has_dependents boolean DEFAULT false NOT NULL,
    depends_on uuid[],
    limit_keys text[] DEFAULT '{}'::text[] NOT NULL,
    limited boolean DEFAULT false NOT NULL,
    snoozes integer DEFAULT 0 NOT NULL,
    callback jsonb,
    fairness_key text,
    max_duration_seconds integer,
    checkpoints jsonb,
    CONSTRAINT jobs_attempt_check CHECK ((attempt >= 0)),
    CONSTRAINT jobs_backoff_initial_check CHECK ((backoff_initial > (0)::double precision)),
    CONSTRAINT jobs_backoff_multiplier_check CHECK ((backoff_multiplier >= (1)::double precision)),
    CONSTRAINT jobs_cancel_request_only_while_running CHECK (((NOT cancel_requested) OR (state = ANY (ARRAY['RUNNING'::evora.job_state, 'CANCELLED'::evora.job_state, 'COMPLETED'::evora.job_state])))),
    CONSTRAINT jobs_check CHECK ((backoff_max >= backoff_initial)),
    CONSTRAINT jobs_dependencies_left CHECK ((dependencies_left >= 0)),
    CONSTRAINT jobs_finished_at_iff_done CHECK (((state = ANY (ARRAY['COMPLETED'::evora.job_state, 'CANCELLED'::evora.job_state, 'DLQ'::evora.job_state])) = (finished_at IS NOT NULL))),
    CONSTRAINT jobs_lease_seconds_check CHECK (((lease_seconds >= 1) AND (lease_seconds <= 86400))),
    CONSTRAINT jobs_max_attempts_check CHECK (((max_attempts >= 1) AND (max_attempts <= 1000))),
    CONSTRAINT jobs_max_duration_seconds_check CHECK ((max_duration_seconds > 0)),
    CONSTRAINT jobs_on_dependency_failure CHECK ((on_dependency_failure = ANY (ARRAY['cancel'::text, 'run'::text]))),
    CONSTRAINT jobs_running_has_lease CHECK (((state <> 'RUNNING'::evora.job_state) OR ((lease_token IS NOT NULL) AND (lease_expires_at IS NOT NULL)))),
    CONSTRAINT jobs_waiting_has_dependencies CHECK (((state <> 'WAITING'::evora.job_state) OR (dependencies_left > 0)))
)
WITH (autovacuum_vacuum_scale_factor='0.01', autovacuum_vacuum_insert_scale_factor='0.01', autovacuum_analyze_scale_factor='0.02', fillfactor='50');
ALTER TABLE ONLY evora.jobs ALTER COLUMN state SET STATISTICS 0;

COMMENT ON COLUMN evora.jobs.backoff_initial IS 'NULL: the default, evora.limits() -> backoff -> initial_seconds';

COMMENT ON COLUMN evora.jobs.backoff_max IS 'NULL: the default, evora.limits() -> backoff -> max_seconds';

COMMENT ON COLUMN evora.jobs.backoff_multiplier IS 'NULL: the default, evora.limits() -> backoff -> multiplier';

COMMENT ON COLUMN evora.jobs.on_dependency_failure IS 'NULL: cancel';

CREATE TYPE evora.move AS (
	job evora.jobs,
	event text,
	from_state evora.job_state,
	worker text,
	data jsonb
);

CREATE TYPE evora.submission AS (
	queue text,
	type text,
	payload jsonb,
	priority smallint,
	run_at timestamp with time zone,
	delay_seconds double precision,
	max_attempts integer,
	lease_seconds integer,
	backoff_initial double precision,
	backoff_max double precision,
	backoff_multiplier double precision,
	expires_at timestamp with time zone,
	idempotency_key text,
	group_key text,
	depends_on text[],
	on_dependency_failure text,
	ref text,
	limit_keys text[],
	fairness_key text,
	debounce_key text,
	debounce_delay double precision,
	debounce_max_delay double precision,
	throttle_key text,
	throttle_window double precision,
	max_duration_seconds integer
);

CREATE FUNCTION evora.admission_limits(keys text[]) RETURNS TABLE(key text, max_pending integer)
    LANGUAGE sql STABLE
    AS $$
    SELECT g.key, g.max_pending
    FROM (SELECT e.key, e.max_pending
          FROM evora.flow_limits e
          WHERE e.key = ANY(keys)
          UNION ALL
          (SELECT DISTINCT ON (k.key) k.key, p.max_pending
           FROM (SELECT * FROM evora.flow_limits WHERE stem IS NOT NULL) AS p
           JOIN unnest(keys) AS k(key) ON starts_with(k.key, p.stem)
           WHERE NOT EXISTS (SELECT 1 FROM evora.flow_limits e WHERE e.key = k.key)
           ORDER BY k.key, length(p.stem) DESC)) AS g
    WHERE g.max_pending IS NOT NULL
$$;

CREATE FUNCTION evora.admit(queues text[], created integer[], limit_key_ords integer[], limit_key_names text[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    admission CONSTANT integer := 1163280708;  -- 'EVAD'
    keys text[] := '{}';
    adding bigint[] := '{}';
    maxima integer[] := '{}';
    k record;
    over record;
BEGIN
    FOR k IN
        WITH held AS (
            SELECT DISTINCT h.ord, h.key
            FROM (SELECT q.ord, 'queue:' || q.queue AS key
                  FROM unnest(queues) WITH ORDINALITY AS q(queue, ord)
                  UNION ALL
                  SELECT l.ord, l.name FROM unnest(limit_key_ords, limit_key_names) AS l(ord, name))
                 AS h
            WHERE h.ord IN (SELECT unnest(created))
        ),
        wanted AS (
            SELECT h.key, count(*) AS adding FROM held h GROUP BY h.key
        )
        SELECT w.key, w.adding, a.max_pending
        FROM wanted w
        JOIN evora.admission_limits(ARRAY(SELECT w.key FROM wanted w)) a ON a.key = w.key
        ORDER BY hashtext(w.key), w.key
    LOOP
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'key % has a max_pending: submit its jobs under READ COMMITTED, '
                            'not %', quote_literal(k.key),
                            upper(current_setting('transaction_isolation'))
                USING ERRCODE = 'feature_not_supported';
        END IF;
        PERFORM pg_advisory_xact_lock(admission, hashtext(k.key));
        keys := keys || k.key;
        adding := adding || k.adding;
        maxima := maxima || k.max_pending;
    END LOOP;
    IF keys = '{}' THEN
        RETURN;
    END IF;
    SELECT w.key, w.adding, w.max_pending, d.depth INTO over
    FROM unnest(keys, adding, maxima) AS w(key, adding, max_pending)
    CROSS JOIN LATERAL (SELECT evora.pending_holding(w.key, w.max_pending + 1) AS depth) AS d
    WHERE d.depth + w.adding > w.max_pending
    ORDER BY w.key
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'queue_full: key % has % jobs waiting to run (PENDING or WAITING) and a '
                        'max_pending of %: % more would exceed it', quote_literal(over.key),
                        CASE WHEN over.depth > over.max_pending THEN 'over ' || over.max_pending
                             ELSE over.depth::text END,
                        over.max_pending, over.adding
            USING ERRCODE = 'EV429', DETAIL = over.key,
                  HINT = 'retry once jobs holding the key have been claimed';
    END IF;
END
$$;

CREATE FUNCTION evora.await_children(parent uuid, children uuid[], on_failure text, suppressed text[]) RETURNS TABLE(outcome text, cause uuid, job evora.jobs, notified text[], owed text[])
    LANGUAGE plpgsql ROWS 1
    AS $$
DECLARE
    at CONSTANT timestamptz := evora.clock_now();
    j evora.jobs;
    fresh uuid[];
    named integer;
    arrived integer;
    cancelled uuid;
    next evora.job_state;
BEGIN
    SELECT x.* INTO j FROM evora.jobs x WHERE x.id = parent AND x.state = 'RUNNING';
    fresh := ARRAY(
        SELECT u.id FROM unnest(children) WITH ORDINALITY AS u(id, n)
        WHERE u.id <> ALL(coalesce(j.depends_on, '{}'))
        GROUP BY u.id ORDER BY min(u.n));
    SELECT count(*)::integer,
           (count(*) FILTER (WHERE h.state IN ('COMPLETED', 'CANCELLED')))::integer,
           (array_agg(h.id ORDER BY h.id) FILTER (WHERE h.state = 'CANCELLED'))[1]
    INTO named, arrived, cancelled
    FROM evora.hold_dependencies(fresh) AS h;
    j.on_dependency_failure := nullif(coalesce(on_failure, j.on_dependency_failure), 'cancel');
    j.dependencies_left := named;
    next := evora.dependent_next_state(j, arrived, cancelled IS NOT NULL);
    IF next = 'CANCELLED' THEN
        RETURN QUERY SELECT 'cancelled_dependency', cancelled, NULL::evora.jobs, NULL::text[],
                            NULL::text[];
        RETURN;
    END IF;
    INSERT INTO evora.job_dependencies (job_id, depends_on)
    SELECT parent, c FROM unnest(fresh) AS c;
    UPDATE evora.jobs x
    SET state = next,
        attempt = x.attempt - 1,
        on_dependency_failure = j.on_dependency_failure,
        depends_on = coalesce(x.depends_on, '{}') || fresh,
        dependencies_left = named - arrived,
        lease_expires_at = NULL,
        run_at = CASE WHEN next = 'PENDING' THEN at ELSE x.run_at END,
        updated_at = at, version = x.version + 1
    WHERE x.id = parent AND x.state = 'RUNNING'
    RETURNING x.* INTO j;
    RETURN QUERY SELECT 'done', NULL::uuid, j, r.notified, r.owed
    FROM evora.record_moves(
        ARRAY[ROW(j, 'awaiting_children', 'RUNNING', j.worker_id,
                  jsonb_build_object('children', cardinality(fresh),
                                     'waiting_for', j.dependencies_left))::evora.move],
        suppressed) AS r;
END
$$;

CREATE FUNCTION evora.backoff_seconds(initial double precision, max_seconds double precision, multiplier double precision, n integer) RETURNS double precision
    LANGUAGE sql
    AS $$
    SELECT least(
        b.max_seconds,
        exp(least(ln(b.initial) + greatest(n - 1, 0) * ln(b.multiplier), ln(b.max_seconds) + 1))
            * (0.8 + 0.4 * random()))
    FROM (SELECT coalesce(initial, (d ->> 'initial_seconds')::float8) AS initial,
                 coalesce(max_seconds, (d ->> 'max_seconds')::float8) AS max_seconds,
                 coalesce(multiplier, (d ->> 'multiplier')::float8) AS multiplier
          FROM (SELECT evora.limits() -> 'backoff' AS d) AS defaults) AS b
$$;

CREATE TABLE evora.event_batches (
    seqs bigint[] NOT NULL,
    seq bigint GENERATED ALWAYS AS (seqs[1]) STORED NOT NULL,
    last_seq bigint GENERATED ALWAYS AS (seqs[cardinality(seqs)]) STORED NOT NULL,
    xid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    at timestamp with time zone NOT NULL,
    job_ids uuid[] NOT NULL,
    job_versions integer[] NOT NULL,
    queues text[] NOT NULL,
    types text[] NOT NULL,
    events text[] NOT NULL,
    from_states evora.job_state[] NOT NULL,
    to_states evora.job_state[] NOT NULL,
    attempts integer[] NOT NULL,
    worker_ids text[] NOT NULL,
    data jsonb[],
    jobs evora.job_image[] NOT NULL,
    CONSTRAINT event_batches_shape CHECK (((cardinality(job_ids) = cardinality(seqs)) AND (cardinality(job_versions) = cardinality(seqs)) AND (cardinality(queues) = cardinality(seqs)) AND (cardinality(types) = cardinality(seqs)) AND (cardinality(events) = cardinality(seqs)) AND (cardinality(from_states) = cardinality(seqs)) AND (cardinality(to_states) = cardinality(seqs)) AND (cardinality(attempts) = cardinality(seqs)) AND (cardinality(worker_ids) = cardinality(seqs)) AND ((data IS NULL) OR (cardinality(data) = cardinality(seqs))) AND (cardinality(jobs) = cardinality(seqs)))),
    CONSTRAINT event_batches_size CHECK ((cardinality(seqs) >= 1))
)
PARTITION BY RANGE (at);

CREATE TABLE evora.job_event_rows (
    seq bigint CONSTRAINT job_events_seq_not_null1 NOT NULL,
    xid xid8 DEFAULT pg_current_xact_id() CONSTRAINT job_events_xid_not_null1 NOT NULL,
    job_id uuid CONSTRAINT job_events_job_id_not_null1 NOT NULL,
    job_version integer CONSTRAINT job_events_job_version_not_null1 NOT NULL,
    queue text CONSTRAINT job_events_queue_not_null1 NOT NULL,
    type text CONSTRAINT job_events_type_not_null1 NOT NULL,
    event text CONSTRAINT job_events_event_not_null1 NOT NULL,
    from_state evora.job_state,
    to_state evora.job_state CONSTRAINT job_events_to_state_not_null1 NOT NULL,
    attempt integer CONSTRAINT job_events_attempt_not_null1 NOT NULL,
    worker_id text,
    at timestamp with time zone CONSTRAINT job_events_at_not_null1 NOT NULL,
    data jsonb DEFAULT '{}'::jsonb CONSTRAINT job_events_data_not_null1 NOT NULL,
    job evora.job_image CONSTRAINT job_events_job_not_null1 NOT NULL
)
PARTITION BY RANGE (at);

CREATE FUNCTION evora.batch_events(b evora.event_batches) RETURNS SETOF evora.job_event_rows
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT e.seq, b.xid, e.job_id, e.job_version, e.queue, e.type, e.event,
           e.from_state, e.to_state, e.attempt, e.worker_id, b.at,
           coalesce(e.data, '{}'::jsonb), e.job
    FROM (SELECT unnest(b.seqs) AS seq, unnest(b.job_ids) AS job_id, unnest(b.job_versions) AS job_version,
                 unnest(b.queues) AS queue, unnest(b.types) AS type, unnest(b.events) AS event,
                 unnest(b.from_states) AS from_state, unnest(b.to_states) AS to_state,
                 unnest(b.attempts) AS attempt, unnest(b.worker_ids) AS worker_id,
                 unnest(b.data) AS data, unnest(b.jobs) AS job) e
$$;

CREATE FUNCTION evora.batch_partition(rows_partition text) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT 'event_batches_p' || substr(rows_partition, length('job_events_p') + 1)
$$;

CREATE TABLE evora.callbacks (
    id uuid NOT NULL,
    secret_hash bytea NOT NULL,
    job_id uuid NOT NULL,
    attempt integer NOT NULL,
    on_timeout text NOT NULL,
    created_at timestamp with time zone NOT NULL,
    timeout_at timestamp with time zone NOT NULL,
    outcome text,
    settled_at timestamp with time zone,
    payload jsonb,
    CONSTRAINT callbacks_on_timeout CHECK ((on_timeout = ANY (ARRAY['fail'::text, 'dlq'::text, 'resume'::text]))),
    CONSTRAINT callbacks_outcome CHECK ((outcome = ANY (ARRAY['resolved'::text, 'timed_out'::text, 'cancelled'::text]))),
    CONSTRAINT callbacks_settled_iff_outcome CHECK (((outcome IS NULL) = (settled_at IS NULL)))
);

CREATE FUNCTION evora.callback_resolution(c evora.callbacks) RETURNS jsonb
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT jsonb_build_object('callback', c.id, 'job_id', c.job_id, 'resolved_at', c.settled_at,
                              'payload', c.payload)
$$;

CREATE FUNCTION evora.callback_secret_hash(secret text) RETURNS bytea
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT sha256(convert_to(secret, 'UTF8'))
$$;

CREATE FUNCTION evora.cancel_held(ids uuid[], suppressed text[]) RETURNS TABLE(job evora.jobs, notified text[], owed text[])
    LANGUAGE sql ROWS 100
    SET random_page_cost TO '1'
    AS $$
    WITH target AS (
        SELECT j.id, j.state FROM evora.jobs j
        WHERE j.id = ANY(ids)
          AND j.state IN ('PENDING', 'WAITING', 'SUSPENDED', 'RUNNING')
          AND (j.state <> 'RUNNING' OR NOT j.cancel_requested)
    ),
    moved AS (
        UPDATE evora.jobs j
        SET state = CASE WHEN t.state = 'RUNNING' THEN j.state ELSE 'CANCELLED' END,
            cancel_requested = (t.state = 'RUNNING'),
            finished_at = CASE WHEN t.state = 'RUNNING' THEN NULL ELSE evora.clock_now() END,
            updated_at = evora.clock_now(), version = j.version + 1
        FROM target t WHERE j.id = t.id AND j.id = ANY(ids)
        RETURNING j AS whole, t.state AS from_state,
            ROW(j, CASE WHEN t.state = 'RUNNING' THEN 'cancel_requested' ELSE 'cancelled' END,
                t.state, j.worker_id, '{}')::evora.move AS move
    ),
    voided AS (
        UPDATE evora.callbacks c SET outcome = 'cancelled', settled_at = evora.clock_now()
        FROM moved m
        WHERE m.from_state = 'SUSPENDED' AND c.job_id = (m.whole).id AND c.outcome IS NULL
    ),
    recorded AS (
        SELECT * FROM evora.record_moves(ARRAY(SELECT move FROM moved), suppressed)
    )
    SELECT m.whole, r.notified, r.owed
    FROM moved m CROSS JOIN recorded r
$$;

CREATE FUNCTION evora.cancel_job(job_id uuid, suppressed text[]) RETURNS TABLE(outcome text, job evora.jobs, notified text[], owed text[])
    LANGUAGE plpgsql ROWS 1
    SET random_page_cost TO '1'
    AS $$
DECLARE
    parent RECORD;
    current evora.jobs;
    family_notified text[];
    family_owed text[];
BEGIN
    PERFORM evora.hold_spawned_tree(job_id);
    SELECT j.* INTO current FROM evora.jobs j WHERE j.id = job_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found', NULL::evora.jobs, NULL::text[], NULL::text[];
        RETURN;
    END IF;
    SELECT c.job, c.notified, c.owed INTO parent
    FROM evora.cancel_held(ARRAY[job_id], suppressed) AS c;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'refused', current, NULL::text[], NULL::text[];
        RETURN;
    END IF;
    IF (parent.job).state = 'CANCELLED' THEN
        SELECT c.notified, c.owed INTO family_notified, family_owed
        FROM evora.cancel_held(evora.hold_spawned_tree(job_id), suppressed || parent.notified)
            AS c
        LIMIT 1;
    END IF;
    RETURN QUERY SELECT 'done', parent.job, parent.notified || family_notified,
                        parent.owed || family_owed;
END
$$;

CREATE FUNCTION evora.claim_fair(queues text[], types text[], wanted integer, worker text) RETURNS TABLE(job evora.jobs, dependency_results jsonb)
    LANGUAGE plpgsql ROWS 1
    AS $$
DECLARE
    q text;
    taken integer := 0;
    need integer;
    at timestamptz;
    fair boolean;
    picked_keys text[];
    starts float8[];
    costs float8[];
    ids uuid[];
    unkeyed uuid[];
    v float8;
    tags jsonb;
BEGIN
    FOR q IN SELECT DISTINCT u.queue FROM unnest(queues) AS u(queue) ORDER BY 1 LOOP
        need := wanted - taken;
        EXIT WHEN need <= 0;
        SELECT f.vtime INTO v FROM evora.fair_queues f WHERE f.queue = q FOR UPDATE;
        fair := FOUND;
        at := evora.clock_now() + (clock_timestamp() - now());
        IF fair THEN
            PERFORM evora.fair_fold(q);
            SELECT coalesce(array_agg(p.id), '{}'), array_agg(p.key), array_agg(p.start),
                   array_agg(p.cost),
                   jsonb_object_agg(p.id, jsonb_build_object('tag', p.tag, 'vtime', v))
            INTO ids, picked_keys, starts, costs, tags
            FROM evora.fair_pick(q, at, types, need, '{}') AS p;
            PERFORM evora.fair_charge(array_fill(q, ARRAY[cardinality(ids)]), picked_keys,
                                      starts, costs);
            PERFORM set_config('evora.fair_tags', coalesce(tags::text, ''), true);
        ELSE
            ids := '{}';
        END IF;
        IF cardinality(ids) < need THEN
            unkeyed := ARRAY(
                SELECT j.id FROM evora.jobs j
                WHERE evora.claimable(j, q, at, types) AND (
j.group_key IS NULL OR (
    (SELECT true FROM evora.jobs r
     WHERE r.state IN ('RUNNING', 'SUSPENDED') AND r.queue = j.queue
       AND r.group_key = j.group_key
     LIMIT 1) IS NULL
    AND (SELECT true FROM evora.jobs e
         WHERE e.state = 'PENDING' AND e.queue = j.queue AND e.group_key = j.group_key
           AND (e.priority, e.submit_seq) < (j.priority, j.submit_seq)
         LIMIT 1) IS NULL)
)
                  AND j.fairness_key IS NULL AND NOT (j.id = ANY(ids))
                ORDER BY j.priority, j.run_at, j.submit_seq
                LIMIT need - cardinality(ids)
                FOR UPDATE OF j SKIP LOCKED);
            ids := ids || unkeyed;
        END IF;
        RETURN QUERY SELECT * FROM evora.claim_jobs(ids, NULL, worker, at);
        PERFORM set_config('evora.fair_tags', '', true);
        taken := taken + cardinality(ids);
    END LOOP;
END
$$;

CREATE FUNCTION evora.claim_jobs(ids uuid[], limited_flags boolean[], claimer text, claimed_at timestamp with time zone) RETURNS TABLE(job evora.jobs, dependency_results jsonb)
    LANGUAGE sql
    SET random_page_cost TO '1'
    SET lock_timeout TO '100ms'
    AS $$
    WITH moved AS (
        UPDATE evora.jobs j
        SET state = 'RUNNING', attempt = j.attempt + 1, lease_token = gen_random_uuid(),
            lease_expires_at = claimed_at + make_interval(secs => j.lease_seconds),
            worker_id = claimer, started_at = claimed_at, updated_at = claimed_at,
            version = j.version + 1, limited = coalesce(p.flag, false)
        FROM unnest(ids, limited_flags) WITH ORDINALITY AS p(id, flag, n)
        WHERE j.id = p.id AND j.id = ANY(ids)
        RETURNING j AS job, evora.event_image(j, 'PENDING') AS image, j.depends_on, p.n
    ),
    fair AS (
        SELECT nullif(current_setting('evora.fair_tags', true), '')::jsonb AS tags
    ),
    recorded AS (
        INSERT INTO evora.event_batches (seqs, at, job_ids, job_versions, queues, types, events,
                                         from_states, to_states, attempts, worker_ids, data,
                                         jobs)
        SELECT evora.next_seqs(count(*)), claimed_at, array_agg((m.job).id ORDER BY m.n),
               array_agg((m.job).version ORDER BY m.n), array_agg((m.job).queue ORDER BY m.n),
               array_agg((m.job).type ORDER BY m.n),
               array_fill('claimed'::text, ARRAY[count(*)::int]),
               array_fill('PENDING'::evora.job_state, ARRAY[count(*)::int]),
               array_fill('RUNNING'::evora.job_state, ARRAY[count(*)::int]),
               array_agg((m.job).attempt ORDER BY m.n), array_fill(claimer, ARRAY[count(*)::int]),
               CASE WHEN (SELECT tags FROM fair) IS NOT NULL THEN
                   array_agg(jsonb_strip_nulls(jsonb_build_object(
                                 'fair', (SELECT tags FROM fair) -> (m.job).id::text))
                             ORDER BY m.n) END,
               array_agg(m.image ORDER BY m.n)
        FROM moved m
        HAVING count(*) > 0
    )
    SELECT m.job,
           CASE WHEN m.depends_on IS NOT NULL THEN (
               SELECT coalesce(jsonb_agg(jsonb_build_array(d.id, d.result) ORDER BY u.n), '[]')
               FROM unnest(m.depends_on) WITH ORDINALITY AS u(id, n)
               JOIN evora.jobs d ON d.id = u.id
               WHERE d.state = 'COMPLETED') END
    FROM moved m
$$;

CREATE FUNCTION evora.claim_limited(queues text[], types text[], wanted integer) RETURNS TABLE(id uuid, limited boolean)
    LANGUAGE sql STABLE ROWS 1
    AS $$
    SELECT NULL::uuid, NULL::boolean WHERE false
$$;

CREATE FUNCTION evora.claim_limited(queues text[], types text[], wanted integer, worker text) RETURNS TABLE(job evora.jobs, dependency_results jsonb)
    LANGUAGE plpgsql ROWS 1
    SET random_page_cost TO '1'
    AS $$
DECLARE
    at CONSTANT timestamptz := evora.clock_now();
    making CONSTANT integer := 1163284306;  -- 'EVOR'
    taken integer := 0;
    paid timestamptz;
    blocked text[] := '{}';
    rest evora.claim_candidate[] := '{}';
    open_queues text[] := queues;
    last_priority smallint[] := array_fill((-32768)::smallint, ARRAY[cardinality(queues)]);
    last_run_at timestamptz[] := array_fill('-infinity'::timestamptz, ARRAY[cardinality(queues)]);
    last_seq bigint[] := array_fill(0::bigint, ARRAY[cardinality(queues)]);
    wide boolean := cardinality(queues) <> 1;
    widen boolean;
    rounds integer := 0;
    window_size integer;
    need integer;
    tried evora.claim_candidate[];
    lim_keys text[];
    lim_conc integer[];
    lim_rate integer[];
    lim_per float8[];
    owned text[];
    new_ids uuid[];
    new_flags boolean[];
    full_keys text[];
    fair_qs text[];
    fair_cands evora.claim_candidate[] := '{}';
    fair_ids uuid[];
    fair_queue text[];
    fair_key text[];
    fair_start float8[];
    fair_cost float8[];
    fair_full text[] := '{}';
BEGIN
    fair_qs := ARRAY(SELECT f.queue FROM evora.fair_queues f WHERE f.queue = ANY(queues)
                     ORDER BY f.queue FOR UPDATE);
    PERFORM evora.fair_fold(f.queue) FROM unnest(fair_qs) AS f(queue);
    WHILE rounds < 4 LOOP
        need := wanted - taken;
        EXIT WHEN need <= 0;
        rest := ARRAY(SELECT r FROM unnest(rest) AS r WHERE NOT (r.keys && blocked));
        IF cardinality(fair_qs) > 0 THEN
            WITH picked AS MATERIALIZED (
                SELECT q.queue, p.*,
                       row_number() OVER (ORDER BY q.queue, p.tag, p.priority, p.run_at,
                                                   p.submit_seq) AS place,
                       count(*) OVER (PARTITION BY q.queue) AS n
                FROM unnest(fair_qs) AS q(queue)
                CROSS JOIN LATERAL evora.fair_pick(q.queue, at, types, need, blocked) AS p
                WHERE NOT ('queue:' || q.queue = ANY(blocked))
            ),
            tried AS MATERIALIZED (
                SELECT * FROM picked p WHERE p.place <= need
            )
            SELECT ARRAY(SELECT ROW(t.id, t.priority, t.run_at, t.submit_seq,
                                    ARRAY(SELECT DISTINCT x
                                          FROM unnest(('queue:' || t.queue) || t.limit_keys)
                                              AS x),
                                    coalesce(t.limit_keys[1], ''),
                                    t.place)::evora.claim_candidate
                         FROM tried t ORDER BY t.place),
                   ARRAY(SELECT t.id FROM tried t ORDER BY t.place),
                   ARRAY(SELECT t.queue FROM tried t ORDER BY t.place),
                   ARRAY(SELECT t.key FROM tried t ORDER BY t.place),
                   ARRAY(SELECT t.start FROM tried t ORDER BY t.place),
                   ARRAY(SELECT t.cost FROM tried t ORDER BY t.place),
                   ARRAY(SELECT DISTINCT p.queue FROM picked p WHERE p.n >= need)
            INTO fair_cands, fair_ids, fair_queue, fair_key, fair_start, fair_cost, fair_full;
        END IF;
        window_size := greatest(CASE WHEN wide THEN 4 * need ELSE need END + 16
                                - cardinality(rest), 0);

        WITH fresh AS MATERIALIZED (
            SELECT q.queue, c.id, c.priority, c.run_at, c.submit_seq,
                   ARRAY(SELECT DISTINCT x
                         FROM unnest(('queue:' || q.queue) || c.limit_keys) AS x) AS keys,
                   coalesce(c.limit_keys[1], '') AS lane
            FROM unnest(open_queues, last_priority, last_run_at, last_seq)
                AS q(queue, priority, run_at, seq)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, j.submit_seq, j.limit_keys
                FROM evora.jobs j
                WHERE evora.claimable(j, q.queue, at, types)
                  AND (j.priority, j.run_at, j.submit_seq) > (q.priority, q.run_at, q.seq)
                  AND (
j.group_key IS NULL OR (
    (SELECT true FROM evora.jobs r
     WHERE r.state IN ('RUNNING', 'SUSPENDED') AND r.queue = j.queue
       AND r.group_key = j.group_key
     LIMIT 1) IS NULL
    AND (SELECT true FROM evora.jobs e
         WHERE e.state = 'PENDING' AND e.queue = j.queue AND e.group_key = j.group_key
           AND (e.priority, e.submit_seq) < (j.priority, j.submit_seq)
         LIMIT 1) IS NULL)
)
                  AND NOT (j.limit_keys && blocked)
                  AND j.fairness_key IS NULL
                ORDER BY j.priority, j.run_at, j.submit_seq
                LIMIT window_size
                FOR UPDATE OF j SKIP LOCKED
            ) AS c
            WHERE NOT ('queue:' || q.queue = ANY(blocked)) AND NOT (q.queue = ANY(fair_full))
        ),
        ends AS MATERIALIZED (
            SELECT e.queue, e.priority, e.run_at, e.submit_seq
            FROM (SELECT f.queue, f.priority, f.run_at, f.submit_seq,
                         count(*) OVER (PARTITION BY f.queue) AS n,
                         row_number() OVER (PARTITION BY f.queue
                                            ORDER BY f.priority DESC, f.run_at DESC,
                                                     f.submit_seq DESC) AS back
                  FROM fresh f) AS e
            WHERE e.back = 1 AND e.n = window_size
            UNION ALL
            SELECT * FROM unnest(open_queues, last_priority, last_run_at, last_seq)
                AS o(queue, priority, run_at, submit_seq)
            WHERE window_size = 0 OR o.queue = ANY(fair_full)
        ),
        win AS MATERIALIZED (
            SELECT f.id, f.priority, f.run_at, f.submit_seq, f.keys, f.lane FROM fresh f
            UNION ALL
            SELECT r.id, r.priority, r.run_at, r.submit_seq, r.keys, r.lane
            FROM unnest(rest) AS r
        ),
        turns AS MATERIALIZED (
            SELECT ROW(w.id, w.priority, w.run_at, w.submit_seq, w.keys,
                       w.lane, NULL)::evora.claim_candidate AS c,
                   row_number() OVER (ORDER BY w.priority, w.turn, w.run_at, w.submit_seq)
                       <= need - cardinality(fair_cands) AS tried,
                   w.turn
            FROM (SELECT w.*, row_number() OVER (PARTITION BY w.lane
                                                 ORDER BY w.priority, w.run_at, w.submit_seq)
                                  AS turn
                  FROM win w) AS w
        ),
        widening AS MATERIALIZED (
            SELECT NOT wide AND EXISTS (SELECT 1 FROM ends)
                   AND EXISTS (SELECT 1 FROM turns t WHERE t.tried AND t.turn > 1) AS yes
        ),
        gov AS MATERIALIZED (
            SELECT * FROM evora.governing_limits(
                ARRAY(SELECT DISTINCT k
                      FROM (SELECT (t.c).keys FROM turns t WHERE t.tried
                            UNION ALL
                            SELECT f.keys FROM unnest(fair_cands) AS f) AS t(keys),
                           unnest(t.keys) AS k
                      WHERE NOT (SELECT w.yes FROM widening w)))
        ),
        row_locked AS MATERIALIZED (
            SELECT b.key FROM evora.flow_buckets b
            WHERE b.key = ANY(ARRAY(SELECT g.key FROM gov g))
            ORDER BY b.key
            FOR UPDATE SKIP LOCKED
        ),
        missing AS MATERIALIZED (
            SELECT g.key, g.rate_limit FROM gov g
            WHERE NOT EXISTS (SELECT 1 FROM evora.flow_buckets o WHERE o.key = g.key)
        ),
        made AS (
            INSERT INTO evora.flow_buckets AS b (key, tokens, refilled_at)
            SELECT m.key, coalesce(m.rate_limit, 0), at
            FROM missing m
            WHERE pg_try_advisory_xact_lock(making, hashtext(m.key))
            ON CONFLICT (key) DO NOTHING
            RETURNING b.key
        ),
        mine AS (
            SELECT key FROM row_locked UNION ALL SELECT key FROM made
        )
        SELECT (SELECT w.yes FROM widening w),
               ARRAY(SELECT t.c FROM turns t WHERE t.tried),
               ARRAY(SELECT t.c FROM turns t WHERE NOT t.tried),
               ARRAY(SELECT e.queue FROM ends e ORDER BY e.queue),
               ARRAY(SELECT e.priority FROM ends e ORDER BY e.queue),
               ARRAY(SELECT e.run_at FROM ends e ORDER BY e.queue),
               ARRAY(SELECT e.submit_seq FROM ends e ORDER BY e.queue),
               ARRAY(SELECT g.key FROM gov g ORDER BY g.key),
               ARRAY(SELECT g.concurrency FROM gov g ORDER BY g.key),
               ARRAY(SELECT g.rate_limit FROM gov g ORDER BY g.key),
               ARRAY(SELECT g.rate_per_seconds FROM gov g ORDER BY g.key),
               ARRAY(SELECT m.key FROM mine m),
               ARRAY(SELECT g.key FROM gov g
                     WHERE NOT EXISTS (SELECT 1 FROM mine m WHERE m.key = g.key))
        INTO widen, tried, rest, open_queues, last_priority, last_run_at, last_seq,
             lim_keys, lim_conc, lim_rate, lim_per, owned, full_keys;
        IF widen THEN
            rest := tried || rest;
            wide := true;
            CONTINUE;
        END IF;
        tried := fair_cands || tried;
        EXIT WHEN cardinality(tried) = 0;
        blocked := blocked || full_keys;

        paid := evora.clock_now() + (clock_timestamp() - now());
        WITH c AS (SELECT * FROM unnest(tried) AS c),
        lim AS (
            SELECT * FROM unnest(lim_keys, lim_conc, lim_rate, lim_per) AS u(key, conc, rate, per)
        ),
        mine AS (SELECT DISTINCT key FROM unnest(owned) AS m(key)),
        running AS (
            SELECT k.key, count(*) AS n
            FROM evora.jobs r
            CROSS JOIN LATERAL unnest(r.limit_keys) AS k(key)
            JOIN mine m ON m.key = k.key
            WHERE r.state >= 'RUNNING' AND r.state <= 'RUNNING' AND r.limit_keys <> '{}'
              AND r.limit_keys && owned
              AND k.key <> 'queue:' || r.queue
            GROUP BY k.key
            UNION ALL
            SELECT m.key, (SELECT count(*) FROM evora.jobs r
                           WHERE r.state = 'RUNNING' AND r.queue = substr(m.key, 7))
            FROM mine m
            WHERE starts_with(m.key, 'queue:')
        ),
        caps AS MATERIALIZED (
            SELECT l.key, l.rate, l.per, least(
                l.conc - coalesce(r.n, 0),
                floor(evora.tokens(b, l.rate, l.per, paid))::bigint) AS cap
            FROM lim l
            JOIN mine m ON m.key = l.key
            JOIN evora.flow_buckets b ON b.key = l.key
            LEFT JOIN (SELECT key, sum(n) AS n FROM running GROUP BY key) AS r ON r.key = l.key
        ),
        ranked AS (
            SELECT c.id, x.cap,
                   row_number() OVER (PARTITION BY x.key
                                      ORDER BY c.fair_rank, c.priority, c.run_at, c.submit_seq)
                       AS place
            FROM c
            CROSS JOIN LATERAL unnest(c.keys) AS k(key)
            JOIN caps x ON x.key = k.key
        ),
        admitted AS (
            SELECT c.id, c.priority, c.run_at, c.submit_seq, c.keys, c.fair_rank,
                   c.keys && lim_keys AS is_limited,
                   row_number() OVER (PARTITION BY c.lane
                                      ORDER BY c.priority, c.run_at, c.submit_seq) AS turn
            FROM c
            WHERE NOT (c.keys && full_keys)
              AND NOT EXISTS (SELECT 1 FROM ranked r
                              WHERE r.id = c.id AND r.cap IS NOT NULL AND r.place > r.cap)
        ),
        chosen AS MATERIALIZED (
            SELECT a.id, a.is_limited, a.keys FROM admitted a
            ORDER BY a.fair_rank, a.priority, a.turn, a.run_at, a.submit_seq
            LIMIT need
        ),
        used AS MATERIALIZED (
            SELECT x.key, count(*) AS n
            FROM (SELECT unnest(ch.keys) AS key FROM chosen ch) AS k
            JOIN caps x ON x.key = k.key
            GROUP BY x.key
        ),
        spent AS (
            UPDATE evora.flow_buckets b
            SET tokens = evora.tokens(b, x.rate, x.per, paid) - u.n,
                refilled_at = greatest(b.refilled_at, paid)
            FROM used u JOIN caps x ON x.key = u.key
            WHERE b.key = u.key AND x.rate IS NOT NULL
        )
        SELECT ARRAY(SELECT ch.id FROM chosen ch),
               ARRAY(SELECT ch.is_limited FROM chosen ch),
               ARRAY(SELECT x.key FROM caps x LEFT JOIN used u ON u.key = x.key
                     WHERE x.cap - coalesce(u.n, 0) <= 0)
        INTO new_ids, new_flags, full_keys;
        RETURN QUERY SELECT * FROM evora.claim_jobs(new_ids, new_flags, worker, paid);
        IF cardinality(fair_cands) > 0 THEN
            PERFORM evora.fair_charge(array_agg(f.queue), array_agg(f.key), array_agg(f.start),
                                      array_agg(f.cost))
            FROM unnest(fair_ids, fair_queue, fair_key, fair_start, fair_cost)
                AS f(id, queue, key, start, cost)
            WHERE f.id = ANY(new_ids);
        END IF;
        taken := taken + cardinality(new_ids);
        rounds := rounds + 1;
        blocked := blocked || full_keys;
        EXIT WHEN cardinality(rest) = 0 AND cardinality(open_queues) = 0;
    END LOOP;
END
$$;

CREATE FUNCTION evora.claimable(j evora.jobs, in_queue text, at timestamp with time zone, types text[]) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT j.state = 'PENDING'::evora.job_state AND j.queue = in_queue AND j.run_at <= at
       AND (j.expires_at IS NULL OR j.expires_at > at OR j.started_at IS NOT NULL)
       AND (types IS NULL OR j.type = ANY(types))
       AND NOT evora.queue_paused(in_queue)
$$;

CREATE FUNCTION evora.client_json(value jsonb, field text) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $_$
DECLARE
    lim CONSTANT jsonb := evora.limits();
BEGIN
    IF octet_length(value::text) > (lim ->> 'max_payload_bytes')::integer THEN
        PERFORM evora.reject(field, format('is %s bytes encoded; the limit is %s',
                                           octet_length(value::text), lim ->> 'max_payload_bytes'));
    END IF;
    IF jsonb_path_exists(value,
            '$.** ? (@.type() == "number" && (@ >= $beyond || @ <= -$beyond))',
            jsonb_build_object('beyond', 179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792::numeric)) THEN
        PERFORM evora.reject(field, 'holds a number beyond the range of a double');
    END IF;
    RETURN value;
END
$_$;

CREATE FUNCTION evora.complete(job_id uuid, lease_token uuid, result jsonb DEFAULT NULL::jsonb) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'evora', 'pg_temp'
    AS $$
BEGIN
    PERFORM evora.raise_unless_done(c.outcome, job_id)
    FROM evora.complete_items(
        ARRAY[job_id], ARRAY[lease_token],
        ARRAY[evora.client_json(coalesce(result, 'null'::jsonb), 'result')], '{}', false) AS c;
    RETURN 'COMPLETED';
END
$$;

CREATE FUNCTION evora.complete_items(ids uuid[], tokens uuid[], results jsonb[], suppressed text[], with_jobs boolean) RETURNS TABLE(outcome text, job evora.jobs, notified text[], owed text[])
    LANGUAGE plpgsql ROWS 100
    SET random_page_cost TO '1'
    AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH items AS (
        SELECT *
        FROM unnest(ids, tokens, results) WITH ORDINALITY AS i(id, token, result, ord)
    ),
    input AS (
        SELECT DISTINCT ON (id, token) *, 'RUNNING'::evora.job_state AS fenced
        FROM items ORDER BY id, token, ord
    ),
    moved AS (
        UPDATE evora.jobs j
        SET state = 'COMPLETED', result = i.result, lease_expires_at = NULL,
            finished_at = evora.clock_now(), updated_at = evora.clock_now(),
            version = j.version + 1
        FROM input i WHERE j.id = i.id AND j.lease_token = i.token AND j.state = i.fenced
                       AND j.id = ANY(ids)
        RETURNING j.id, j.lease_token, j AS job, j.version, j.queue, j.type, j.attempt,
                  j.worker_id, j.updated_at, pg_column_size(i.result) AS result_bytes,
                  evora.event_image(j, 'RUNNING') AS image,
                  j.group_key IS NOT NULL OR j.limited OR j.fairness_key IS NOT NULL AS noted
    ),
    recorded AS (
        INSERT INTO evora.event_batches (seqs, at, job_ids, job_versions, queues, types, events,
                                         from_states, to_states, attempts, worker_ids, data,
                                         jobs)
        SELECT evora.next_seqs(count(*)), m.updated_at, array_agg(m.id), array_agg(m.version), array_agg(m.queue),
               array_agg(m.type), array_fill('completed'::text, ARRAY[count(*)::int]),
               array_fill('RUNNING'::evora.job_state, ARRAY[count(*)::int]),
               array_fill('COMPLETED'::evora.job_state, ARRAY[count(*)::int]),
               array_agg(m.attempt), array_agg(m.worker_id),
               array_agg(jsonb_build_object('result_bytes', m.result_bytes)), array_agg(m.image)
        FROM moved m
        GROUP BY m.updated_at
    ),
    notes AS (
        SELECT n.notified, n.owed
        FROM evora.note_moves(ARRAY(SELECT ROW(m.job, 'completed', 'RUNNING', m.worker_id,
                                               NULL)::evora.move
                                    FROM moved m WHERE m.noted), suppressed) AS n
        WHERE EXISTS (SELECT 1 FROM moved m WHERE m.noted)
    )
    SELECT CASE WHEN m.id IS NOT NULL OR cur.replayed THEN 'done'
                WHEN cur.found THEN 'lease_lost'
                ELSE 'not_found' END,
           CASE WHEN with_jobs THEN coalesce(m.job, CASE WHEN cur.replayed THEN cur.job END) END,
           r.notified, r.owed
    FROM items i
    LEFT JOIN notes r ON true
    LEFT JOIN moved m ON m.id = i.id AND m.lease_token = i.token
    LEFT JOIN LATERAL (
        SELECT true AS found, s.state = 'RUNNING' AND s.lease_token = i.token AS stale,
               s.state = 'COMPLETED' AND s.lease_token = i.token AS replayed, s AS job
        FROM evora.jobs s WHERE s.id = i.id AND m.id IS NULL
        OFFSET 0
    ) snap ON true
    LEFT JOIN LATERAL (
        SELECT true AS found, l.state = 'COMPLETED' AND l.lease_token = i.token AS replayed,
               l AS job
        FROM evora.jobs l WHERE l.id = i.id AND snap.stale
        FOR SHARE
    ) latest ON true
    CROSS JOIN LATERAL (
        SELECT CASE WHEN snap.stale THEN latest.found ELSE snap.found END AS found,
               CASE WHEN snap.stale THEN latest.replayed ELSE snap.replayed END AS replayed,
               CASE WHEN snap.stale THEN latest.job ELSE snap.job END AS job
    ) cur
    ORDER BY i.ord;
END
$$;

CREATE FUNCTION evora.debounce_and_throttle(ids uuid[], queues text[], payloads jsonb[], debounce_keys text[], debounce_delays double precision[], debounce_max_delays double precision[], throttle_keys text[], throttle_windows double precision[]) RETURNS TABLE(item integer, answer text, by_job uuid)
    LANGUAGE plpgsql
    AS $$
DECLARE
    serialised CONSTANT integer := 1163281492;  -- 'EVDT'
    g record;
    last integer;
    o integer;
    absorbing evora.jobs;
    held_job uuid;
    held_since timestamptz;
BEGIN
    FOR g IN
        SELECT k.queue, k.kind, k.key, array_agg(k.ord ORDER BY k.ord) AS ords
        FROM (SELECT u.queue, 'debounce' AS kind, u.key, u.ord::integer AS ord
              FROM unnest(queues, debounce_keys) WITH ORDINALITY AS u(queue, key, ord)
              WHERE u.key IS NOT NULL
              UNION ALL
              SELECT u.queue, 'throttle', u.key, u.ord::integer
              FROM unnest(queues, throttle_keys) WITH ORDINALITY AS u(queue, key, ord)
              WHERE u.key IS NOT NULL) AS k
        GROUP BY k.queue, k.kind, k.key
        ORDER BY hashtext(k.kind || ':' || k.queue || ':' || k.key), k.kind, k.queue, k.key
    LOOP
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION '% key % is serialised per key: submit under READ COMMITTED, not %',
                            g.kind, quote_literal(g.key),
                            upper(current_setting('transaction_isolation'))
                USING ERRCODE = 'feature_not_supported';
        END IF;
        PERFORM pg_advisory_xact_lock(serialised,
                                      hashtext(g.kind || ':' || g.queue || ':' || g.key));
        last := g.ords[cardinality(g.ords)];
        IF g.kind = 'debounce' THEN
            UPDATE evora.jobs j
            SET payload = payloads[last],
                run_at = least(evora.clock_now() + make_interval(secs => debounce_delays[last]),
                               k.run_by),
                updated_at = evora.clock_now(), version = j.version + 1
            FROM evora.submission_keys k
            WHERE k.queue = g.queue AND k.kind = 'debounce' AND k.key = g.key
              AND j.id = k.job_id AND j.state = 'PENDING' AND j.started_at IS NULL
            RETURNING j.* INTO absorbing;
            IF FOUND THEN
                INSERT INTO evora.job_event_rows (job_id, job_version, queue, type, event,
                                              from_state, to_state, attempt, worker_id, at,
                                              data, job)
                VALUES (absorbing.id, absorbing.version, absorbing.queue, absorbing.type,
                        'debounced', 'PENDING', 'PENDING', absorbing.attempt, NULL,
                        absorbing.updated_at,
                        jsonb_build_object('submissions', cardinality(g.ords)),
                        evora.job_image(absorbing));
                RETURN QUERY SELECT u.o, 'debounced'::text, absorbing.id FROM unnest(g.ords) AS u(o);
                CONTINUE;
            END IF;
            INSERT INTO evora.submission_keys AS k (queue, kind, key, job_id, since, run_by)
            VALUES (g.queue, 'debounce', g.key, ids[last], evora.clock_now(),
                    evora.clock_now() + make_interval(secs => debounce_max_delays[last]))
            ON CONFLICT ON CONSTRAINT submission_keys_pkey DO UPDATE
            RETURN QUERY SELECT u.o, 'debounced'::text, ids[last]
                         FROM unnest(g.ords[1:cardinality(g.ords) - 1]) AS u(o);
        ELSE
            SELECT k.job_id, k.since INTO held_job, held_since
            FROM evora.submission_keys k
            JOIN evora.jobs j ON j.id = k.job_id
            WHERE k.queue = g.queue AND k.kind = 'throttle' AND k.key = g.key;
            IF NOT FOUND THEN
                held_job := NULL;
            END IF;
            FOREACH o IN ARRAY g.ords LOOP
                IF held_job IS NOT NULL AND evora.clock_now()
                        < held_since + make_interval(secs => throttle_windows[o]) THEN
                    RETURN QUERY SELECT o, 'throttled'::text, held_job;
                ELSE
                    held_job := ids[o];
                    held_since := evora.clock_now();
                    INSERT INTO evora.submission_keys AS k (queue, kind, key, job_id, since, until)
                    VALUES (g.queue, 'throttle', g.key, held_job, held_since,
                            held_since + make_interval(secs => throttle_windows[o]))
                    ON CONFLICT ON CONSTRAINT submission_keys_pkey DO UPDATE
                END IF;
            END LOOP;
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION evora.dependent_next_state(j evora.jobs, arrived integer, cancelled boolean) RETURNS evora.job_state
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE
        WHEN cancelled AND j.on_dependency_failure IS DISTINCT FROM 'run' THEN 'CANCELLED'::evora.job_state
        WHEN j.dependencies_left <= arrived THEN 'PENDING'::evora.job_state
        ELSE 'WAITING'::evora.job_state
    END
$$;

CREATE FUNCTION evora.drain_buckets(keys text[], untils timestamp with time zone[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    making CONSTANT integer := 1163284306;  -- 'EVOR', as evora.claim_limited()
    d record;
BEGIN
    FOR d IN
        SELECT u.key, max(u.until) AS until
        FROM unnest(keys, untils) AS u(key, until)
        JOIN evora.governing_limits(keys) g ON g.key = u.key
        WHERE g.concurrency IS NOT NULL OR g.rate_limit IS NOT NULL
        GROUP BY u.key
        ORDER BY u.key
    LOOP
        PERFORM pg_advisory_xact_lock(making, hashtext(d.key));
        INSERT INTO evora.flow_buckets AS b (key, tokens, refilled_at, throttled_until)
        VALUES (d.key, 0, d.until, d.until)
        ON CONFLICT (key) DO UPDATE
        SET tokens = 0,
            refilled_at = greatest(b.refilled_at, excluded.refilled_at),
            throttled_until = greatest(b.throttled_until, excluded.throttled_until);
    END LOOP;
END
$$;

CREATE FUNCTION evora.drop_archived_events(upto_seq bigint, older_than_seconds double precision, max_rows integer) RETURNS bigint
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'evora', 'pg_temp'
    AS $$
    SELECT 0::bigint
$$;

CREATE FUNCTION evora.due_holding(k text, most bigint) RETURNS TABLE(id uuid, run_at timestamp with time zone)
    LANGUAGE sql STABLE
    AS $$
    SELECT c.id, c.run_at FROM (
        SELECT q.id, q.run_at FROM (
            SELECT s.id, s.run_at
            FROM evora.pending_priorities(
                CASE WHEN starts_with(k, 'queue:') THEN ARRAY[substr(k, 7)] ELSE '{}' END) AS p
            CROSS JOIN LATERAL (
                SELECT j.id, j.run_at FROM evora.jobs j
                WHERE j.state = 'PENDING' AND j.queue = p.queue AND j.priority = p.priority
                  AND j.run_at <= evora.clock_now()
                ORDER BY j.run_at
                LIMIT most
            ) AS s
            LIMIT most
        ) AS q
        UNION
        SELECT n.id, n.run_at FROM (
            SELECT j.id, j.run_at FROM evora.jobs j
            WHERE j.state = 'PENDING' AND j.limit_keys <> '{}' AND j.limit_keys @> ARRAY[k]
              AND j.run_at <= evora.clock_now()
            LIMIT most
        ) AS n
    ) AS c
    LIMIT most
$$;

CREATE FUNCTION evora.end_attempts(ends evora.attempt_end[], suppressed text[]) RETURNS TABLE(job evora.jobs, notified text[], owed text[])
    LANGUAGE plpgsql ROWS 100
    SET random_page_cost TO '1'
    AS $$
#variable_conflict use_column
DECLARE
    ids CONSTANT uuid[] := ARRAY(SELECT e.id FROM unnest(ends) AS e);
BEGIN
    RETURN QUERY
    WITH decided AS MATERIALIZED (
        SELECT *, 'RUNNING'::evora.job_state AS fenced FROM unnest(ends)
    ),
    moved AS (
        UPDATE evora.jobs j
        SET state = d.to_state,
            attempt = j.attempt - CASE WHEN d.released AND d.to_state = 'PENDING' THEN 1 ELSE 0 END,
            snoozes = j.snoozes + CASE WHEN d.pending_event = 'snoozed' AND d.to_state = 'PENDING'
                                       THEN 1 ELSE 0 END,
            last_error = coalesce(d.error, j.last_error),
            lease_expires_at = NULL,
            run_at = CASE WHEN d.to_state = 'PENDING'
                          THEN evora.clock_now() + make_interval(secs => d.delay) ELSE j.run_at END,
            finished_at = CASE WHEN d.to_state = 'PENDING' THEN NULL ELSE evora.clock_now() END,
            updated_at = evora.clock_now(), version = j.version + 1
        FROM decided d WHERE j.id = d.id AND j.state = d.fenced AND j.id = ANY(ids)
        RETURNING j AS whole, ROW(
            j,
            CASE WHEN d.to_state = 'CANCELLED' THEN 'cancelled'
                 WHEN d.to_state = 'DLQ' THEN 'dead_lettered'
                 ELSE d.pending_event END,
            'RUNNING',
            d.worker,
            (SELECT coalesce(jsonb_object_agg(key, value), '{}')
             FROM jsonb_each(jsonb_build_object(
                 'error', d.error, 'reason', d.reason,
                 'retry_at', CASE WHEN d.to_state = 'PENDING' THEN j.run_at END))
             WHERE value <> 'null')
        )::evora.move AS move
    ),
    recorded AS (
        SELECT * FROM evora.record_moves(ARRAY(SELECT move FROM moved), suppressed)
    )
    SELECT m.whole, r.notified, r.owed
    FROM moved m CROSS JOIN recorded r;
END
$$;

CREATE FUNCTION evora.event_image(j evora.jobs, from_state evora.job_state) RETURNS evora.job_image
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT ROW(NULL, NULL, NULL, NULL,
               CASE WHEN j.group_key IS NOT NULL THEN j.priority END, j.group_key, NULL,
               NULL, NULL, NULL,
               CASE WHEN j.state IN ('PENDING', 'RUNNING') THEN j.run_at END, NULL,
               NULL, NULL, NULL, NULL, NULL,
               CASE WHEN j.group_key IS NOT NULL THEN j.submit_seq END, NULL, NULL,
               CASE WHEN 'RUNNING' IN (j.state, from_state) THEN j.started_at END,
               NULL)::evora.job_image
$$;

CREATE FUNCTION evora.event_partitions() RETURNS TABLE(name text, lower timestamp with time zone, upper timestamp with time zone, detach_pending boolean)
    LANGUAGE sql STABLE
    AS $$
    SELECT t.name, t.lower, t.upper, t.detach_pending FROM evora.event_tables() t
    WHERE t.parent = 'evora.job_event_rows'
$$;

CREATE FUNCTION evora.event_tables() RETURNS TABLE(parent text, name text, lower timestamp with time zone, upper timestamp with time zone, detach_pending boolean)
    LANGUAGE sql STABLE
    AS $$
    SELECT 'evora.' || p.relname, c.relname::text,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''([^'']+)''\)')::timestamptz,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)')::timestamptz,
           i.inhdetachpending
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
    WHERE i.inhparent IN ('evora.job_event_rows'::regclass, 'evora.event_batches'::regclass)
    ORDER BY 4, 1
$$;

CREATE FUNCTION evora.events_between(lo bigint, hi bigint) RETURNS SETOF evora.job_event_rows
    LANGUAGE sql STABLE
    AS $$
    SELECT * FROM evora.job_event_rows r WHERE r.seq >= lo AND r.seq < hi
    UNION ALL
    SELECT e.* FROM evora.event_batches b CROSS JOIN LATERAL evora.batch_events(b) e
    WHERE b.seq < hi AND b.last_seq >= lo AND e.seq >= lo AND e.seq < hi
$$;

CREATE FUNCTION evora.events_in_seq_range(lo bigint, hi bigint) RETURNS SETOF evora.job_event_rows
    LANGUAGE sql STABLE
    SET plan_cache_mode TO 'force_custom_plan'
    SET enable_seqscan TO 'off'
    AS $$
    SELECT * FROM evora.events_between(lo, hi)
$$;

CREATE FUNCTION evora.events_of_job(id uuid) RETURNS SETOF evora.job_event_rows
    LANGUAGE sql STABLE
    SET plan_cache_mode TO 'force_custom_plan'
    SET enable_seqscan TO 'off'
    AS $$
    SELECT * FROM evora.job_event_rows r WHERE r.job_id = id
    UNION ALL
    SELECT e.* FROM evora.event_batches b CROSS JOIN LATERAL evora.batch_events(b) e
    WHERE evora.job_id_times(b.job_ids) @> evora.job_id_times(ARRAY[id])
      AND b.job_ids @> ARRAY[id] AND e.job_id = id
$$;

CREATE FUNCTION evora.expire_callbacks(batch integer, suppressed text[]) RETURNS TABLE(job evora.jobs, notified text[], owed text[])
    LANGUAGE plpgsql ROWS 100
    AS $$
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

CREATE FUNCTION evora.expired_event_partitions(older_than double precision, archived_only boolean) RETURNS TABLE(name text, attached boolean, detach_pending boolean)
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'evora', 'pg_temp'
    AS $$
    SELECT NULL::text, NULL::boolean, NULL::boolean WHERE false
$$;

CREATE FUNCTION evora.expired_event_tables(older_than double precision, archived_only boolean) RETURNS TABLE(parent text, name text, attached boolean, detach_pending boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'evora', 'pg_temp'
    AS $_$
DECLARE
    slot      record;
    part      record;
    consumed  xid8;
    mark      evora.event_archive_watermark;
    oldest    timestamptz;
    last_xid  xid8;
    past_mark boolean;
BEGIN
    IF older_than IS NULL OR older_than < 0 THEN
        RAISE EXCEPTION 'invalid retention (older than %)', older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
        SELECT CASE WHEN c.relname LIKE 'event\_batches\_p%' THEN 'evora.event_batches'
                    ELSE 'evora.job_event_rows' END,
               c.relname::text, false, false
        FROM pg_class c
        WHERE c.relnamespace = 'evora'::regnamespace AND c.relkind = 'r'
          AND (c.relname LIKE 'job\_events\_p%' OR c.relname LIKE 'event\_batches\_p%')
          AND NOT c.relispartition;
    SELECT p.xid INTO consumed FROM evora.projector_progress p ORDER BY p.xid LIMIT 1;
    SELECT * INTO STRICT mark FROM evora.event_archive_watermark;
    SELECT min(a.xact_start) + (evora.clock_now() - now()) INTO oldest
    FROM pg_stat_activity a WHERE a.xact_start IS NOT NULL AND a.pid <> pg_backend_pid();
    <<slots>>
    FOR slot IN
        SELECT p.upper FROM evora.event_tables() p
        WHERE p.upper <= evora.clock_now() - make_interval(secs => older_than)
          AND (oldest IS NULL OR oldest >= p.upper)
        GROUP BY p.upper
        ORDER BY p.upper
    LOOP
        FOR part IN SELECT p.parent, p.name FROM evora.event_tables() p WHERE p.upper = slot.upper LOOP
            EXECUTE format('SELECT e.xid FROM evora.%I e ORDER BY e.xid DESC LIMIT 1', part.name)
                INTO last_xid;
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM evora.%I e WHERE e.%I > $1)', part.name,
                           CASE WHEN part.parent = 'evora.event_batches' THEN 'last_seq'
                                ELSE 'seq' END)
                INTO past_mark USING mark.upto_seq;
            IF last_xid IS NOT NULL AND NOT (
                coalesce(last_xid < consumed, false)  -- (no progress recorded: not consumed)
                AND (NOT archived_only OR (NOT past_mark AND last_xid < mark.below_xid))
            ) THEN
                EXIT slots;
            END IF;
        END LOOP;
        RETURN QUERY
            SELECT p.parent, p.name, true, p.detach_pending FROM evora.event_tables() p
            WHERE p.upper = slot.upper;
    END LOOP;
END
$_$;

CREATE FUNCTION evora.fail(job_id uuid, lease_token uuid, error jsonb, retryable boolean DEFAULT true, retry_in_seconds double precision DEFAULT NULL::double precision, retry_after jsonb DEFAULT NULL::jsonb) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'evora', 'pg_temp'
    AS $$
DECLARE
    lim CONSTANT jsonb := evora.limits();
    answer text;
    moved evora.job_state;
    stored jsonb;
    given text;
    after_key text;
    after_seconds float8;
BEGIN
    IF error IS NULL OR jsonb_typeof(error) <> 'object'
            OR jsonb_typeof(error -> 'message') IS DISTINCT FROM 'string' THEN
        PERFORM evora.reject('error', 'must be a JSON object with a string message');
    END IF;
    FOR given IN SELECT jsonb_object_keys(error) LOOP
        IF given NOT IN ('message', 'type', 'traceback') THEN
            PERFORM evora.reject('error.' || given, 'is not a field of an error');
        END IF;
    END LOOP;
    IF coalesce(jsonb_typeof(error -> 'type'), 'null') NOT IN ('string', 'null')
            OR length(error ->> 'type') > (lim ->> 'max_error_type')::integer THEN
        PERFORM evora.reject('error.type', format('must be a string of at most %s characters',
                                                  lim ->> 'max_error_type'));
    END IF;
    IF coalesce(jsonb_typeof(error -> 'traceback'), 'null') NOT IN ('string', 'null') THEN
        PERFORM evora.reject('error.traceback', 'must be a string');
    END IF;
    stored := jsonb_build_object(
        'message', left(error ->> 'message', (lim ->> 'max_error_message')::integer),
        'type', error ->> 'type');
    IF error ->> 'traceback' IS NOT NULL THEN
        stored := stored || jsonb_build_object('traceback', right(
            error ->> 'traceback', (lim ->> 'max_error_traceback')::integer));
    END IF;
    IF retryable IS NULL THEN
        PERFORM evora.reject('retryable', 'must be true or false');
    END IF;
    IF retry_in_seconds IS NOT NULL AND (retry_in_seconds = 'NaN'
            OR retry_in_seconds NOT BETWEEN 0 AND (evora.limits() ->> 'max_seconds')::float8) THEN
        PERFORM evora.reject('retry_in_seconds', format('must be between 0 and %s',
                                                        evora.limits() ->> 'max_seconds'));
    END IF;
    IF retry_after IS NOT NULL AND jsonb_typeof(retry_after) <> 'null' THEN
        IF jsonb_typeof(retry_after) <> 'object' THEN
            PERFORM evora.reject('retry_after', 'must be a JSON object');
        END IF;
        FOR given IN SELECT jsonb_object_keys(retry_after) LOOP
            IF given NOT IN ('limit_key', 'seconds') THEN
                PERFORM evora.reject('retry_after.' || given, 'is not a field of retry_after');
            END IF;
        END LOOP;
        after_key := evora.text_field(retry_after -> 'limit_key', 'retry_after.limit_key',
                                      lim ->> 'limit_key_pattern', NULL, false);
        after_seconds := evora.number_field(
            coalesce(retry_after -> 'seconds', 'null'), 'retry_after.seconds', 0,
            (lim ->> 'max_retry_after_seconds')::numeric, false, true);
        IF retry_in_seconds IS NOT NULL THEN
            PERFORM evora.reject('retry_after', 'give retry_in_seconds or retry_after, not both');
        END IF;
        IF NOT retryable THEN
            PERFORM evora.reject('retry_after', 'a failure that is not retryable is not retried');
        END IF;
    END IF;
    SELECT f.outcome, (f.job).state INTO answer, moved
    FROM evora.fail_items(ARRAY[job_id], ARRAY[lease_token], ARRAY[stored], ARRAY[retryable],
                          ARRAY[coalesce(after_seconds, retry_in_seconds)], ARRAY[after_key],
                          '{}', true) AS f;
    PERFORM evora.raise_unless_done(answer, job_id);
    RETURN moved;
END
$$;

CREATE FUNCTION evora.fail_items(ids uuid[], tokens uuid[], errors jsonb[], retryables boolean[], retry_ins double precision[], suppressed text[], with_jobs boolean) RETURNS TABLE(outcome text, job evora.jobs, notified text[], owed text[])
    LANGUAGE sql ROWS 100
    AS $$
    SELECT * FROM evora.fail_items(ids, tokens, errors, retryables, retry_ins,
                                   array_fill(NULL::text, ARRAY[cardinality(ids)]), suppressed,
                                   with_jobs)
$$;

CREATE FUNCTION evora.fail_items(ids uuid[], tokens uuid[], errors jsonb[], retryables boolean[], retry_ins double precision[], after_keys text[], suppressed text[], with_jobs boolean) RETURNS TABLE(outcome text, job evora.jobs, notified text[], owed text[])
    LANGUAGE plpgsql ROWS 100
    SET random_page_cost TO '1'
    AS $$
#variable_conflict use_column
DECLARE
    drains text[];
    untils timestamptz[];
BEGIN
    IF array_remove(after_keys, NULL) <> '{}' THEN
        WITH fence AS MATERIALIZED (SELECT 'RUNNING'::evora.job_state AS state)
        SELECT array_agg(i.key), array_agg(evora.clock_now() + make_interval(secs => i.retry_in))
        INTO drains, untils
        FROM fence f
        CROSS JOIN unnest(ids, tokens, after_keys, retry_ins) AS i(id, token, key, retry_in)
        JOIN evora.jobs j ON j.id = i.id AND j.lease_token = i.token AND j.state = f.state
        WHERE i.key IS NOT NULL AND j.id = ANY(ids);
        PERFORM evora.drain_buckets(coalesce(drains, '{}'), coalesce(untils, '{}'));
    END IF;
    RETURN QUERY
    WITH items AS (
        SELECT *
        FROM unnest(ids, tokens, errors, retryables, retry_ins, after_keys)
            WITH ORDINALITY AS i(id, token, error, retryable, retry_in, after_key, ord)
    ),
    input AS (
        SELECT DISTINCT ON (id, token) *, 'RUNNING'::evora.job_state AS fenced
        FROM items ORDER BY id, token, ord
    ),
    decided AS (
        SELECT ROW(
            j.id,
            CASE WHEN j.cancel_requested THEN 'CANCELLED'
                 WHEN i.after_key IS NOT NULL THEN 'PENDING'
                 WHEN NOT i.retryable OR j.attempt >= j.max_attempts THEN 'DLQ'
                 ELSE 'PENDING' END::evora.job_state,
            i.error,
            CASE WHEN j.cancel_requested THEN 'cancel_requested'
                 WHEN i.after_key IS NOT NULL THEN 'throttled_upstream'
                 WHEN NOT i.retryable THEN 'not_retryable'
                 WHEN j.attempt >= j.max_attempts THEN 'failed' END,
            coalesce(i.retry_in, evora.backoff_seconds(j.backoff_initial, j.backoff_max,
                                                       j.backoff_multiplier, j.attempt)),
            i.after_key IS NOT NULL,
            CASE WHEN i.after_key IS NOT NULL THEN 'released' ELSE 'failed' END, j.worker_id
        )::evora.attempt_end AS decision
        FROM evora.jobs j JOIN input i ON i.id = j.id AND i.token = j.lease_token AND j.state = i.fenced
        WHERE j.id = ANY(ids)
        FOR UPDATE OF j
    ),
    ended AS (
        SELECT * FROM evora.end_attempts(ARRAY(SELECT decision FROM decided), suppressed)
    )
    SELECT CASE WHEN won.ord IS NOT NULL THEN 'done'
                WHEN EXISTS (SELECT 1 FROM evora.jobs x WHERE x.id = i.id) THEN 'lease_lost'
                ELSE 'not_found' END,
           CASE WHEN with_jobs THEN won.job END,
           (SELECT e.notified FROM ended e LIMIT 1),
           (SELECT e.owed FROM ended e LIMIT 1)
    FROM items i
    LEFT JOIN (
        SELECT d.ord, e.job
        FROM ended e JOIN input d ON d.id = (e.job).id AND d.token = (e.job).lease_token
    ) won ON won.ord = i.ord
    ORDER BY i.ord;
END
$$;

CREATE FUNCTION evora.fair_charge(queues text[], fkeys text[], starts double precision[], costs double precision[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    WITH served AS MATERIALIZED (
        SELECT u.queue, u.key, count(*) AS n, min(u.start) AS start, min(u.cost) AS cost
        FROM unnest(queues, fkeys, starts, costs) AS u(queue, key, start, cost)
        GROUP BY u.queue, u.key
    ),
    charged AS (
        UPDATE evora.fair_keys k
        SET vfinish = s.start + s.n * s.cost, running = k.running + s.n,
            outstanding = k.outstanding + s.n * k.est, served = k.served + s.n
        FROM served s
        WHERE k.queue = s.queue AND k.key = s.key
    )
    UPDATE evora.fair_queues f SET vtime = greatest(f.vtime, s.last)
    FROM (SELECT s.queue, max(s.start + (s.n - 1) * s.cost) AS last FROM served s
          GROUP BY s.queue) AS s
    WHERE f.queue = s.queue;
END
$$;

CREATE FUNCTION evora.fair_fold(q text) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    folded_keys text[];
    folded_ended bigint[];
    folded_held float8[];
    v float8;
BEGIN
    WITH gone AS (
        DELETE FROM evora.fair_ledger l WHERE l.queue = q RETURNING l.key, l.ended, l.held
    )
    SELECT array_agg(g.key ORDER BY g.key), array_agg(g.n ORDER BY g.key),
           array_agg(g.seconds ORDER BY g.key)
    INTO folded_keys, folded_ended, folded_held
    FROM (SELECT o.key, sum(o.ended) AS n, sum(o.held) AS seconds FROM gone o GROUP BY o.key)
        AS g;
    IF folded_keys IS NULL THEN
        RETURN;
    END IF;
    SELECT f.vtime INTO v FROM evora.fair_queues f WHERE f.queue = q;
    INSERT INTO evora.fair_keys (queue, key, vfinish)
    SELECT q, u.key, v FROM unnest(folded_keys) AS u(key)
    ON CONFLICT (queue, key) DO UPDATE SET backlogged = true;
    UPDATE evora.fair_keys k
    SET vfinish = k.vfinish + (u.held - least(u.ended, k.running)
                                        * (k.outstanding / greatest(k.running, 1)))
                              / evora.fairness_weight(k.key),
        outstanding = k.outstanding - least(u.ended, k.running)
                                      * (k.outstanding / greatest(k.running, 1)),
        running = k.running - least(u.ended, k.running),
        est = k.est * power(0.8, u.ended) + (u.held / u.ended) * (1 - power(0.8, u.ended)),
        held_seconds = k.held_seconds + u.held
    FROM unnest(folded_keys, folded_ended, folded_held) AS u(key, ended, held)
    WHERE k.queue = q AND k.key = u.key AND u.ended > 0;
END
$$;

CREATE FUNCTION evora.fair_note(queues text[], fkeys text[], ended integer[], held double precision[]) RETURNS void
    LANGUAGE sql
    AS $$
    WITH noted AS (
        INSERT INTO evora.fair_ledger (queue, key, ended, held)
        SELECT u.queue, u.key, sum(u.ended), sum(u.held)
        FROM unnest(queues, fkeys, ended, held) AS u(queue, key, ended, held)
        WHERE u.key IS NOT NULL
        GROUP BY u.queue, u.key
        RETURNING queue
    )
    INSERT INTO evora.fair_queues (queue)
    SELECT DISTINCT n.queue FROM noted n
    ORDER BY 1
    ON CONFLICT (queue) DO NOTHING
$$;

CREATE FUNCTION evora.fair_pick(q text, at timestamp with time zone, types text[], need integer, blocked text[]) RETURNS TABLE(key text, start double precision, cost double precision, tag double precision, id uuid, priority smallint, run_at timestamp with time zone, submit_seq bigint, limit_keys text[])
    LANGUAGE plpgsql ROWS 10
    AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH cand AS MATERIALIZED (
        SELECT k.key, k.vfinish,
               greatest(k.vfinish, (SELECT f.vtime FROM evora.fair_queues f WHERE f.queue = q))
                   AS s,
               k.est / evora.fairness_weight(k.key) AS cost
        FROM evora.fair_keys k
        WHERE k.queue = q AND k.backlogged
          AND (SELECT true FROM evora.jobs j
               WHERE j.queue = q AND j.fairness_key = k.key
                 AND evora.claimable(j, q, at, types) AND (
j.group_key IS NULL OR (
    (SELECT true FROM evora.jobs r
     WHERE r.state IN ('RUNNING', 'SUSPENDED') AND r.queue = j.queue
       AND r.group_key = j.group_key
     LIMIT 1) IS NULL
    AND (SELECT true FROM evora.jobs e
         WHERE e.state = 'PENDING' AND e.queue = j.queue AND e.group_key = j.group_key
           AND (e.priority, e.submit_seq) < (j.priority, j.submit_seq)
         LIMIT 1) IS NULL)
)
                 AND NOT (j.limit_keys && blocked)
               LIMIT 1)
        ORDER BY k.vfinish, k.key
        LIMIT need
    ),
    offered AS (
        SELECT c.key, c.s, c.cost, c.s + (x.n - 1) * c.cost AS tag, x.id, x.priority,
               x.run_at, x.submit_seq, x.limit_keys
        FROM cand c
        CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at, j.submit_seq, j.limit_keys,
                   row_number() OVER (ORDER BY j.priority, j.run_at, j.submit_seq) AS n
            FROM evora.jobs j
            WHERE j.queue = q AND j.fairness_key = c.key
              AND evora.claimable(j, q, at, types) AND (
j.group_key IS NULL OR (
    (SELECT true FROM evora.jobs r
     WHERE r.state IN ('RUNNING', 'SUSPENDED') AND r.queue = j.queue
       AND r.group_key = j.group_key
     LIMIT 1) IS NULL
    AND (SELECT true FROM evora.jobs e
         WHERE e.state = 'PENDING' AND e.queue = j.queue AND e.group_key = j.group_key
           AND (e.priority, e.submit_seq) < (j.priority, j.submit_seq)
         LIMIT 1) IS NULL)
)
              AND NOT (j.limit_keys && blocked)
            ORDER BY j.priority, j.run_at, j.submit_seq
            LIMIT need
        ) AS x
    ),
    chosen AS MATERIALIZED (
        SELECT o.* FROM offered o ORDER BY o.tag, o.priority, o.run_at, o.submit_seq
        LIMIT need
    ),
    locked AS MATERIALIZED (
        SELECT j.id FROM evora.jobs j
        WHERE j.id = ANY(ARRAY(SELECT c.id FROM chosen c)) AND j.state = 'PENDING'
        FOR UPDATE OF j SKIP LOCKED
    ),
    walked AS MATERIALIZED (
        SELECT CASE WHEN (SELECT count(*) FROM cand) < need THEN 'infinity'
                    ELSE (SELECT c.vfinish FROM cand c ORDER BY c.vfinish DESC, c.key DESC
                          LIMIT 1) END AS finish,
               CASE WHEN (SELECT count(*) FROM cand) >= need
                    THEN (SELECT c.key FROM cand c ORDER BY c.vfinish DESC, c.key DESC
                          LIMIT 1) END AS key
    ),
    unwalked AS (
        UPDATE evora.fair_keys k SET backlogged = false
        WHERE k.queue = q AND k.backlogged
          AND (k.vfinish, k.key) < ((SELECT w.finish FROM walked w), (SELECT w.key FROM walked w))
          AND NOT EXISTS (SELECT 1 FROM evora.jobs j
                          WHERE j.queue = q AND j.fairness_key = k.key
                            AND j.state IN ('PENDING', 'WAITING'))
          AND k.vfinish <= greatest((SELECT f.vtime FROM evora.fair_queues f WHERE f.queue = q),
                                    (SELECT max(c.tag) FROM chosen c))
    )
    SELECT c.key, c.s, c.cost, c.tag, c.id, c.priority, c.run_at, c.submit_seq, c.limit_keys
    FROM chosen c
    JOIN locked l ON l.id = c.id
    ORDER BY c.tag, c.priority, c.run_at, c.submit_seq;
END
$$;

CREATE FUNCTION evora.fairness_weight(fkey text) RETURNS double precision
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(
        (SELECT w.weight FROM evora.fairness_weights w WHERE w.key = fkey),
        (SELECT w.weight FROM evora.fairness_weights w
         WHERE w.stem IS NOT NULL AND starts_with(fkey, w.stem)
         ORDER BY length(w.stem) DESC LIMIT 1),
        1::float8)
$$;

CREATE FUNCTION evora.fairness_weight_set_by(fkey text) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(
        (SELECT w.key FROM evora.fairness_weights w WHERE w.key = fkey),
        (SELECT w.key FROM evora.fairness_weights w
         WHERE w.stem IS NOT NULL AND starts_with(fkey, w.stem)
         ORDER BY length(w.stem) DESC LIMIT 1))
$$;

CREATE FUNCTION evora.first_event_seq(from_seq bigint) RETURNS bigint
    LANGUAGE plpgsql STABLE
    SET plan_cache_mode TO 'force_custom_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    last  bigint := coalesce(
        pg_sequence_last_value(pg_get_serial_sequence('evora.job_event_rows', 'seq')::regclass),
        0);
    lo    bigint := greatest(from_seq, 1);
    width bigint := 1024;
    hit   bigint;
    mid   bigint;
BEGIN
    WHILE hit IS NULL AND lo <= last LOOP
        SELECT e.seq INTO hit FROM evora.events_between(lo, lo + width) e LIMIT 1;
        IF hit IS NULL THEN
            lo := lo + width;
            width := width * 2;
        END IF;
    END LOOP;
    IF hit IS NULL THEN
        RETURN NULL;
    END IF;
    WHILE hit - lo > 1024 LOOP
        mid := lo + (hit - lo) / 2;
        SELECT coalesce(min(e.seq), hit) INTO hit FROM (
            SELECT e.seq FROM evora.events_between(lo, mid) e LIMIT 1) e;
        IF hit >= mid THEN
            lo := mid;
        END IF;
    END LOOP;
    RETURN (SELECT min(e.seq) FROM evora.events_between(lo, hit + 1) e);
END
$$;

CREATE FUNCTION evora.for_each_item(vals anyarray, items integer) RETURNS anyarray
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN cardinality(vals) = 1 THEN array_fill(vals[1], ARRAY[items]) ELSE vals END
$$;

CREATE FUNCTION evora.governing_limits(keys text[]) RETURNS TABLE(key text, concurrency integer, rate_limit integer, rate_per_seconds double precision)
    LANGUAGE sql STABLE
    AS $$
    SELECT e.key, e.concurrency, e.rate_limit, e.rate_per_seconds
    FROM evora.flow_limits e
    WHERE e.key = ANY(keys)
    UNION ALL
    (SELECT DISTINCT ON (k.key) k.key, p.concurrency, p.rate_limit, p.rate_per_seconds
     FROM (SELECT * FROM evora.flow_limits WHERE stem IS NOT NULL) AS p
     JOIN unnest(keys) AS k(key) ON starts_with(k.key, p.stem)
     WHERE NOT EXISTS (SELECT 1 FROM evora.flow_limits e WHERE e.key = k.key)
     ORDER BY k.key, length(p.stem) DESC)
$$;

CREATE FUNCTION evora.hold_dependencies(ids uuid[]) RETURNS TABLE(id uuid, state evora.job_state)
    LANGUAGE sql
    AS $$
    WITH held AS (
        SELECT x.id FROM evora.jobs x WHERE x.id = ANY(ids) ORDER BY x.id FOR NO KEY UPDATE
    )
    UPDATE evora.jobs j SET has_dependents = true
    FROM held h
    WHERE j.id = h.id
    RETURNING j.id, j.state
$$;

CREATE FUNCTION evora.hold_spawned_tree(parent uuid) RETURNS uuid[]
    LANGUAGE sql
    AS $$
    WITH held AS (
        SELECT j.id FROM evora.jobs j
        WHERE j.id = ANY(ARRAY(SELECT evora.spawned_tree(parent)) || parent)
        ORDER BY j.state = 'WAITING', j.id
        FOR UPDATE
    )
    SELECT coalesce(array_agg(h.id ORDER BY h.id) FILTER (WHERE h.id <> parent), '{}')
    FROM held h
$$;

CREATE FUNCTION evora.insert_event_row() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO evora.job_event_rows (job_id, job_version, queue, type, event, from_state,
                                      to_state, attempt, worker_id, at, data, job)
    VALUES (NEW.job_id, NEW.job_version, NEW.queue, NEW.type, NEW.event, NEW.from_state,
            NEW.to_state, NEW.attempt, NEW.worker_id, NEW.at, coalesce(NEW.data, '{}'),
            NEW.job)
    RETURNING seq, xid, data INTO NEW.seq, NEW.xid, NEW.data;
    RETURN NEW;
END
$$;

CREATE FUNCTION evora.job_id_times(ids uuid[]) RETURNS bytea[]
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
DECLARE
    keys bytea[] := '{}';
    one  uuid;
    key  bytea;
    last bytea;
BEGIN
    FOREACH one IN ARRAY ids LOOP
        key := substring(uuid_send(one) FROM 1 FOR 6);
        IF key IS DISTINCT FROM last THEN
            keys := keys || key;
            last := key;
        END IF;
    END LOOP;
    RETURN keys;
END
$$;

CREATE FUNCTION evora.job_image(j evora.jobs) RETURNS evora.job_image
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT ROW(j.id, j.queue, j.type, j.state, j.priority, j.group_key, j.idempotency_key,
               j.attempt, j.max_attempts, j.lease_seconds, j.run_at, j.expires_at,
               j.lease_expires_at, j.worker_id, j.cancel_requested, j.last_error, j.version,
               j.submit_seq, j.created_at, j.updated_at, j.started_at, j.finished_at)::evora.job_image
$$;

CREATE FUNCTION evora.last_event_seq() RETURNS bigint
    LANGUAGE plpgsql STABLE
    SET plan_cache_mode TO 'force_custom_plan'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    hi    bigint := coalesce(
        pg_sequence_last_value(pg_get_serial_sequence('evora.job_event_rows', 'seq')::regclass),
        0);
    width bigint := 1024;
    found bigint;
BEGIN
    WHILE hi > 0 LOOP
        SELECT max(e.seq) INTO found FROM evora.events_between(hi - width + 1, hi + 1) e;
        IF found IS NOT NULL THEN
            RETURN found;
        END IF;
        hi := hi - width;
        width := width * 2;
    END LOOP;
    RETURN 0;
END
$$;

CREATE FUNCTION evora.leave_dlq(ids uuid[], to_state evora.job_state, suppressed text[]) RETURNS TABLE(job evora.jobs, notified text[], owed text[])
    LANGUAGE plpgsql ROWS 100
    AS $$
#variable_conflict use_column
DECLARE
    retried CONSTANT boolean := to_state = 'PENDING';
BEGIN
    IF to_state NOT IN ('PENDING', 'CANCELLED') THEN
        RAISE EXCEPTION 'a job leaves the DLQ to PENDING or CANCELLED, not %', to_state;
    END IF;
    RETURN QUERY
    WITH moved AS (
        UPDATE evora.jobs j
        SET state = to_state,
            attempt = CASE WHEN retried THEN 0 ELSE j.attempt END,
            run_at = CASE WHEN retried THEN evora.clock_now() ELSE j.run_at END,
            finished_at = CASE WHEN retried THEN NULL ELSE evora.clock_now() END,
            expires_at = CASE WHEN retried AND j.expires_at <= evora.clock_now() THEN NULL
                              ELSE j.expires_at END,
            lease_expires_at = NULL, updated_at = evora.clock_now(), version = j.version + 1
        WHERE j.id = ANY(ids) AND j.state = 'DLQ'
        RETURNING j AS whole, ROW(
            j,
            CASE WHEN retried THEN 'retried' ELSE 'cancelled' END,
            'DLQ',
            NULL,
            CASE WHEN retried THEN '{}' ELSE '{"reason": "discarded"}' END::jsonb
        )::evora.move AS move
    ),
    recorded AS (
        SELECT * FROM evora.record_moves(ARRAY(SELECT move FROM moved), suppressed)
    )
    SELECT m.whole, r.notified, r.owed
    FROM moved m CROSS JOIN recorded r;
END
$$;

CREATE FUNCTION evora.limit_key_lists(ords integer[], names text[]) RETURNS TABLE(ord integer, names text[])
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT u.ord, array_agg(u.name ORDER BY u.n)
    FROM unnest(ords, names) WITH ORDINALITY AS u(ord, name, n)
    GROUP BY u.ord
$$;

CREATE FUNCTION evora.limit_keys_field(value jsonb, field text) RETURNS text[]
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    lim CONSTANT jsonb := evora.limits();
    keys text[] := '{}';
    element jsonb;
    place integer := 0;
BEGIN
    IF jsonb_typeof(value) <> 'array'
            OR jsonb_array_length(value) > (lim ->> 'max_limit_keys')::integer THEN
        PERFORM evora.reject(field, format('must be a JSON array of at most %s keys',
                                           lim ->> 'max_limit_keys'));
    END IF;
    FOR element IN SELECT * FROM jsonb_array_elements(value) LOOP
        keys := keys || evora.text_field(element, format('%s.%s', field, place),
                                         lim ->> 'limit_key_pattern', NULL, false);
        IF keys[cardinality(keys)] = ANY(keys[1:cardinality(keys) - 1]) THEN
            PERFORM evora.reject(field, format('names the key %L more than once',
                                               keys[cardinality(keys)]));
        END IF;
        place := place + 1;
    END LOOP;
    RETURN keys;
END
$$;

CREATE FUNCTION evora.limits() RETURNS jsonb
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $_$
    SELECT '{
        "queue_pattern": "^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$",
        "type_pattern": "^[A-Za-z0-9_.:-]{1,255}$",
        "key_max_length": 255,
        "limit_key_pattern": "^[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}$",
        "max_limit_keys": 8,
        "max_payload_bytes": 1048576,
        "max_seconds": 315360000,
        "max_batch": 1000,
        "priority": {"min": -32768, "max": 32767, "default": 0},
        "max_attempts": {"min": 1, "max": 1000, "default": 5},
        "lease_seconds": {"min": 1, "max": 86400, "default": 30},
        "backoff": {"initial_seconds": 1.0, "max_seconds": 3600.0, "multiplier": 2.0,
                    "max_multiplier": 1000},
        "max_dependencies": 1000,
        "ref_pattern": "^[A-Za-z0-9_.:-]{1,255}$",
        "max_error_message": 8192,
        "max_error_traceback": 8192,
        "max_error_type": 255,
        "max_retry_after_seconds": 86400
    }'::jsonb
$_$;

CREATE FUNCTION evora.make_event_partitions(width double precision, ahead integer) RETURNS double precision
    LANGUAGE plpgsql
    AS $$
DECLARE
    target timestamptz;
    newest timestamptz;
    lo     timestamptz;
    hi     timestamptz;
    part   text;
    slot   record;
    idx    regclass;
BEGIN
    IF width IS NULL OR width < 1 OR ahead IS NULL OR ahead < 1 THEN
        RAISE EXCEPTION 'invalid partitioning (% seconds, % ahead)', width, ahead
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    LOCK TABLE evora.job_event_rows IN SHARE UPDATE EXCLUSIVE MODE;
    LOCK TABLE evora.event_batches IN SHARE UPDATE EXCLUSIVE MODE;
    target := evora.clock_now() + make_interval(secs => width * ahead);
    SELECT max(p.upper) INTO newest FROM evora.event_partitions() p;
    lo := greatest(newest, to_timestamp(floor(extract(epoch FROM evora.clock_now()) / width) * width));
    WHILE lo < target LOOP
        hi := to_timestamp((floor(extract(epoch FROM lo) / width) + 1) * width);
        part := 'job_events_p' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD')
                || CASE WHEN lo = date_trunc('day', lo AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                        THEN '' ELSE to_char(lo AT TIME ZONE 'UTC', '_HH24MISS') END;
        EXECUTE format('CREATE TABLE evora.%I (LIKE evora.job_event_rows INCLUDING DEFAULTS)', part);
        EXECUTE format('ALTER TABLE evora.job_event_rows ATTACH PARTITION evora.%I FOR VALUES FROM (%L) TO (%L)',
                       part, lo, hi);
        lo := hi;
    END LOOP;
    FOR slot IN
        SELECT p.name, p.lower, p.upper FROM evora.event_partitions() p
        WHERE to_regclass(format('evora.%I', evora.batch_partition(p.name))) IS NULL
    LOOP
        part := evora.batch_partition(slot.name);
        EXECUTE format('CREATE TABLE evora.%I (LIKE evora.event_batches INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED)', part);
        EXECUTE format('ALTER TABLE evora.event_batches ATTACH PARTITION evora.%I FOR VALUES FROM (%s) TO (%L)',
                       part, coalesce(quote_literal(slot.lower), 'MINVALUE'), slot.upper);
    END LOOP;
    FOR idx IN
        SELECT x.indexrelid::regclass
        FROM evora.event_tables() p
        JOIN pg_index x ON x.indrelid = format('evora.%I', p.name)::regclass
        JOIN pg_inherits h ON h.inhrelid = x.indexrelid
        WHERE h.inhparent IN ('evora.job_events_seq'::regclass, 'evora.event_batches_seq'::regclass)
          AND p.upper <= evora.clock_now()
    LOOP
        PERFORM brin_summarize_new_values(idx);
    END LOOP;
    RETURN extract(epoch FROM greatest(lo, newest) - evora.clock_now());
END
$$;

CREATE FUNCTION evora.next_seqs(n bigint) RETURNS bigint[]
    LANGUAGE sql
    AS $$
    SELECT array_agg(s ORDER BY s)
    FROM (SELECT nextval('evora.job_events_seq_seq') AS s FROM generate_series(1, n)) t
$$;

CREATE FUNCTION evora.note_ended_dependency() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    noted text := coalesce(current_setting('evora.ended_dependencies', true), '');
    full_chunks integer;
BEGIN
    IF octet_length(noted) >= 8192 THEN
        full_chunks := coalesce(nullif(current_setting('evora.ended_dependency_chunks', true),
                                       ''), '0')::integer + 1;
        PERFORM set_config('evora.ended_dependencies_' || full_chunks, noted, true);
        PERFORM set_config('evora.ended_dependency_chunks', full_chunks::text, true);
        noted := '';
    END IF;
    PERFORM set_config('evora.ended_dependencies', noted || NEW.id || ',', true);
    RETURN NULL;  -- an AFTER trigger's result is not used
END
$$;

CREATE FUNCTION evora.note_moves(moves evora.move[], suppressed text[]) RETURNS TABLE(notified text[], owed text[])
    LANGUAGE plpgsql ROWS 1
    AS $$
#variable_conflict use_column
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(moves) AS m WHERE (m.job).fairness_key IS NOT NULL) THEN
        PERFORM evora.fair_note(array_agg((m.job).queue), array_agg((m.job).fairness_key),
                                array_agg(CASE WHEN m.from_state = 'RUNNING' THEN 1 ELSE 0 END),
                                array_agg(CASE WHEN m.from_state = 'RUNNING'
                                               THEN extract(epoch FROM (m.job).updated_at
                                                                       - (m.job).started_at)::float8
                                               ELSE 0 END))
        FROM unnest(moves) AS m
        WHERE (m.job).fairness_key IS NOT NULL
          AND (m.from_state = 'RUNNING' OR (m.job).state IN ('PENDING', 'WAITING'));
    END IF;
    RETURN QUERY
    WITH claimable AS (
        SELECT DISTINCT (m.job).queue AS q FROM unnest(moves) AS m
        WHERE (m.job).state = 'PENDING' OR (m.job).group_key IS NOT NULL
           OR ((m.job).limited AND m.from_state = 'RUNNING')
    ),
    hinted AS (
        SELECT q, pg_notify('evora_jobs', q) AS sent
        FROM claimable
        WHERE q <> ALL(suppressed)
    )
    SELECT (SELECT array_agg(q) FROM hinted),
           (SELECT array_agg(q) FROM claimable WHERE q = ANY(suppressed));
END
$$;

CREATE FUNCTION evora.number_field(value jsonb, field text, lo numeric, hi numeric, integral boolean, above_lo boolean DEFAULT false) RETURNS numeric
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    n numeric;
BEGIN
    IF jsonb_typeof(value) <> 'number' THEN
        PERFORM evora.reject(field, CASE WHEN integral THEN 'must be an integer'
                                         ELSE 'must be a number' END);
    END IF;
    n := value::text::numeric;
    IF integral AND n <> trunc(n) THEN
        PERFORM evora.reject(field, 'must be an integer');
    END IF;
    IF n > hi OR (CASE WHEN above_lo THEN n <= lo ELSE n < lo END) THEN
        PERFORM evora.reject(field, format('must be %s %s and at most %s',
            CASE WHEN above_lo THEN 'above' ELSE 'at least' END, lo, hi));
    END IF;
    RETURN n;
END
$$;

CREATE FUNCTION evora.object_field(value jsonb, field text, known text[]) RETURNS void
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    name text;
BEGIN
    IF jsonb_typeof(value) <> 'object' THEN
        PERFORM evora.reject(field, 'must be a JSON object');
    END IF;
    FOR name IN SELECT jsonb_object_keys(value) LOOP
        IF name <> ALL(known) THEN
            PERFORM evora.reject(field || '.' || name,
                                 format('is not a %s field', regexp_replace(field, '^.*[.]', '')));
        END IF;
    END LOOP;
    FOREACH name IN ARRAY known LOOP
        IF NOT value ? name OR jsonb_typeof(value -> name) = 'null' THEN
            RAISE EXCEPTION '%.%: is required', field, name
                USING ERRCODE = 'not_null_violation', COLUMN = field || '.' || name;
        END IF;
    END LOOP;
END
$$;

CREATE FUNCTION evora.pending_holding(k text, most bigint) RETURNS bigint
    LANGUAGE sql STABLE
    AS $$
    SELECT (SELECT count(*) FROM (
                SELECT 1 FROM evora.jobs p
                WHERE starts_with(k, 'queue:') AND p.state IN ('PENDING', 'WAITING')
                  AND p.queue = substr(k, 7)
                LIMIT most) AS q)
         + (SELECT count(*) FROM (
                SELECT 1 FROM evora.jobs p
                WHERE p.state IN ('PENDING', 'WAITING') AND p.limit_keys <> '{}'
                  AND p.limit_keys @> ARRAY[k]
                  AND NOT (starts_with(k, 'queue:') AND p.queue = substr(k, 7))
                LIMIT most) AS l)
$$;

CREATE FUNCTION evora.pending_priorities(queues text[]) RETURNS TABLE(queue text, priority smallint)
    LANGUAGE sql STABLE ROWS 10
    AS $$
    WITH RECURSIVE p(queue, priority) AS (
        SELECT q.queue, (SELECT min(j.priority) FROM evora.jobs j
                         WHERE j.state = 'PENDING' AND j.queue = q.queue)
        FROM unnest(queues) AS q(queue)
        UNION ALL
        SELECT p.queue, (SELECT min(j.priority) FROM evora.jobs j
                         WHERE j.state = 'PENDING' AND j.queue = p.queue
                           AND j.priority > p.priority)
        FROM p WHERE p.priority IS NOT NULL
    )
    SELECT p.queue, p.priority FROM p WHERE p.priority IS NOT NULL
$$;

CREATE FUNCTION evora.pending_queues() RETURNS TABLE(queue text)
    LANGUAGE sql STABLE ROWS 10
    AS $$
    WITH RECURSIVE q(queue) AS (
        (SELECT j.queue FROM evora.jobs j WHERE j.state = 'PENDING' ORDER BY j.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT j.queue FROM evora.jobs j
                WHERE j.state = 'PENDING' AND j.queue > q.queue ORDER BY j.queue LIMIT 1)
        FROM q WHERE q.queue IS NOT NULL
    )
    SELECT q.queue FROM q WHERE q.queue IS NOT NULL
$$;

CREATE FUNCTION evora.prune_finished(age double precision, batch integer, finished evora.job_state) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    held uuid[];
    removed bigint;
BEGIN
    held := ARRAY(
        SELECT f.id FROM evora.jobs f
        WHERE f.state = finished AND f.state IN ('COMPLETED', 'CANCELLED', 'DLQ')
          AND f.finished_at < evora.clock_now() - make_interval(secs => age)
          AND NOT (f.has_dependents AND EXISTS (SELECT 1 FROM evora.waiting_dependents(f.id)))
        ORDER BY f.finished_at
        LIMIT batch
        FOR UPDATE SKIP LOCKED);
    WITH gone AS (
        DELETE FROM evora.jobs f
        WHERE f.id = ANY(held)
          AND NOT (f.has_dependents AND EXISTS (SELECT 1 FROM evora.waiting_dependents(f.id)))
        RETURNING f.queue, f.state
    ),
    counted AS (
        INSERT INTO evora.job_prune_counts AS c (queue, state, pruned)
        SELECT g.queue, g.state, count(*) FROM gone g GROUP BY g.queue, g.state
        ORDER BY g.queue, g.state
        ON CONFLICT (queue, state) DO UPDATE SET pruned = c.pruned + excluded.pruned
    )
    SELECT count(*) INTO removed FROM gone;
    RETURN removed;
END
$$;

CREATE FUNCTION evora.prune_flow_buckets(after text, batch integer) RETURNS TABLE(pruned bigint, last_key text)
    LANGUAGE plpgsql
    AS $$
DECLARE
    at CONSTANT timestamptz := evora.clock_now();
    keys text[];
BEGIN
    keys := ARRAY(SELECT b.key FROM evora.flow_buckets b WHERE b.key > after
                  ORDER BY b.key LIMIT batch);
    last_key := CASE WHEN cardinality(keys) = batch THEN keys[batch] END;
    WITH governing AS MATERIALIZED (
        SELECT * FROM evora.governing_limits(keys)
    ),
    gone AS (
        DELETE FROM evora.flow_buckets
        WHERE key IN (
            SELECT b.key FROM evora.flow_buckets b
            LEFT JOIN governing g ON g.key = b.key
            WHERE b.key = ANY(keys)
              AND (b.throttled_until IS NULL OR b.throttled_until <= at)
              AND (g.rate_limit IS NULL
                   OR evora.tokens(b, g.rate_limit, g.rate_per_seconds, at) >= g.rate_limit)
            FOR UPDATE OF b SKIP LOCKED)
        RETURNING 1
    )
    SELECT count(*) INTO pruned FROM gone;
    RETURN NEXT;
END
$$;

CREATE FUNCTION evora.prune_submission_keys(batch integer) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    removed bigint;
    debounced bigint;
    queues text[];
    keys text[];
    jobs uuid[];
BEGIN
    WITH gone AS (
        DELETE FROM evora.submission_keys
        WHERE (queue, kind, key) IN (
            SELECT t.queue, t.kind, t.key FROM evora.submission_keys t
            WHERE t.kind = 'throttle' AND t.until <= evora.clock_now()
            ORDER BY t.until
            LIMIT batch
            FOR UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT count(*) INTO removed FROM gone;
    IF removed >= batch THEN
        RETURN removed;
    END IF;
    SELECT array_agg(d.queue), array_agg(d.key), array_agg(d.job_id) INTO queues, keys, jobs
    FROM (SELECT d.queue, d.key, d.job_id FROM evora.submission_keys d
          WHERE d.kind = 'debounce'
            AND (SELECT j.state = 'PENDING' AND j.started_at IS NULL
                 FROM evora.jobs j WHERE j.id = d.job_id) IS NOT TRUE
          ORDER BY d.since
          LIMIT batch - removed) AS d;
    WITH gone AS (
        DELETE FROM evora.submission_keys
        WHERE (queue, kind, key) IN (
            SELECT d.queue, d.kind, d.key FROM evora.submission_keys d
            WHERE d.kind = 'debounce'
              AND (d.queue, d.key, d.job_id) IN (SELECT * FROM unnest(queues, keys, jobs))
            FOR UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT count(*) INTO debounced FROM gone;
    RETURN removed + debounced;
END
$$;

CREATE FUNCTION evora.queue_paused(in_queue text) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT EXISTS (SELECT 1 FROM evora.paused_queues p WHERE p.queue = in_queue)
$$;

CREATE FUNCTION evora.raise_unless_done(outcome text, job_id uuid) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF outcome = 'lease_lost' THEN
        RAISE EXCEPTION 'job %: the lease token is not the current lease of the job', job_id
            USING ERRCODE = 'EV409',
                  HINT = 'the lease expired or the job was finished under another lease; '
                         'roll back: the job is not yours any more';
    ELSIF outcome = 'not_found' THEN
        RAISE EXCEPTION 'job %: not found', job_id USING ERRCODE = 'EV404';
    END IF;
END
$$;

CREATE FUNCTION evora.record_limit_change() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO evora.flow_limit_changes (key, deleted) VALUES (OLD.key, true);
    ELSE
        INSERT INTO evora.flow_limit_changes (key, concurrency, rate_limit, rate_per_seconds,
                                              max_pending, deleted)
        VALUES (NEW.key, NEW.concurrency, NEW.rate_limit, NEW.rate_per_seconds, NEW.max_pending,
                false);
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION evora.record_moves(moves evora.move[], suppressed text[]) RETURNS TABLE(notified text[], owed text[])
    LANGUAGE plpgsql ROWS 1
    AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH moved AS (
        SELECT (m.job).*, m.job AS whole, m.event, m.from_state, m.worker, m.data, m.n
        FROM unnest(moves) WITH ORDINALITY AS m(job, event, from_state, worker, data, n)
    ),
    recorded AS (
        INSERT INTO evora.event_batches (seqs, at, job_ids, job_versions, queues, types, events,
                                         from_states, to_states, attempts, worker_ids, data,
                                         jobs)
        SELECT evora.next_seqs(count(*)), updated_at, array_agg(id ORDER BY n),
               array_agg(version ORDER BY n), array_agg(queue ORDER BY n), array_agg(type ORDER BY n),
               array_agg(event ORDER BY n), array_agg(from_state ORDER BY n),
               array_agg(state ORDER BY n), array_agg(attempt ORDER BY n),
               array_agg(worker ORDER BY n),
               CASE WHEN bool_or(data <> '{}') THEN array_agg(data ORDER BY n) END,
               array_agg(evora.event_image(whole, from_state) ORDER BY n)
        FROM moved
        GROUP BY updated_at
        ORDER BY min(n)
    )
    SELECT n.notified, n.owed FROM evora.note_moves(moves, suppressed) AS n;
END
$$;

CREATE FUNCTION evora.reject(field text, problem text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION '%: %', field, problem
        USING ERRCODE = 'invalid_parameter_value', COLUMN = field;
END
$$;

CREATE FUNCTION evora.reject_event_change() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'job_events is append-only (% rejected)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE FUNCTION evora.reject_illegal_transition() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        RAISE EXCEPTION 'a new job must be PENDING or WAITING, not %', NEW.state
            USING ERRCODE = 'check_violation';
    END IF;
    RAISE EXCEPTION 'illegal job transition % -> % (job %)', OLD.state, NEW.state, OLD.id
        USING ERRCODE = 'check_violation';
END
$$;

CREATE FUNCTION evora.reject_live_delete() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'job % is % and may not be deleted', OLD.id, OLD.state
        USING ERRCODE = 'check_violation';
END
$$;

CREATE FUNCTION evora.remove_job_references() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    ids uuid[];
BEGIN
    ids := ARRAY(SELECT g.id FROM gone g);
    IF ids = '{}' THEN
        RETURN NULL;
    END IF;
    DELETE FROM evora.callbacks c WHERE c.job_id = ANY(ids);
    DELETE FROM evora.job_dependencies d WHERE d.job_id = ANY(ids);
    DELETE FROM evora.job_traces t WHERE t.job_id = ANY(ids);
    DELETE FROM evora.spawned_children s WHERE s.parent = ANY(ids);
    RETURN NULL;
END
$$;

CREATE FUNCTION evora.resolve_callback(callback_id text, payload jsonb DEFAULT NULL::jsonb) RETURNS jsonb
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'evora', 'pg_temp'
    AS $$
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

CREATE FUNCTION evora.resolve_callback_item(secret text, of_job uuid, payload jsonb, suppressed text[]) RETURNS TABLE(outcome text, resolution jsonb, job evora.jobs, notified text[], owed text[])
    LANGUAGE plpgsql ROWS 1
    AS $$
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

CREATE FUNCTION evora.running_holding(k text) RETURNS bigint
    LANGUAGE sql STABLE
    AS $$
    SELECT (SELECT count(*) FROM evora.jobs r
            WHERE starts_with(k, 'queue:') AND r.state = 'RUNNING' AND r.queue = substr(k, 7))
         + (SELECT count(*) FROM evora.jobs r
            WHERE r.state = 'RUNNING' AND r.limit_keys <> '{}' AND r.limit_keys @> ARRAY[k]
              AND NOT (starts_with(k, 'queue:') AND r.queue = substr(k, 7)))
$$;

CREATE FUNCTION evora.settle_dependents() RETURNS trigger
    LANGUAGE plpgsql
    SET random_page_cost TO '1'
    AS $$
DECLARE
    ended_ids uuid[];
    ended_states evora.job_state[];
    hinted bigint;
BEGIN
    IF coalesce(current_setting('evora.ended_dependencies', true), '') = '' THEN
        RETURN NULL;
    END IF;
    ended_ids := evora.take_ended_dependencies();
    SELECT array_agg(j.id ORDER BY j.id), array_agg(j.state ORDER BY j.id)
    INTO ended_ids, ended_states
    FROM evora.jobs j
    WHERE j.id = ANY(ended_ids);

    PERFORM 1
    FROM evora.jobs j
    WHERE j.id IN (SELECT s.id FROM evora.settlement(ended_ids, ended_states) s)
    ORDER BY j.id
    FOR UPDATE OF j;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;

    PERFORM set_config('evora.settling', 'on', true);
    WITH settled AS (
        UPDATE evora.jobs j
        SET state = n.state,
            dependencies_left = CASE WHEN n.state = 'CANCELLED' THEN j.dependencies_left
                                     ELSE j.dependencies_left - n.arrived END,
            version = j.version + (n.state <> 'WAITING')::int,
            updated_at = CASE WHEN n.state <> 'WAITING' THEN evora.clock_now() ELSE j.updated_at END,
            finished_at = CASE WHEN n.state = 'CANCELLED' THEN evora.clock_now() END
        FROM evora.settlement(ended_ids, ended_states) n
        WHERE j.id = n.id AND j.state = 'WAITING'
        RETURNING j.*, n.cause, evora.event_image(j, 'WAITING') AS image
    ),
    recorded AS (
        INSERT INTO evora.event_batches (seqs, at, job_ids, job_versions, queues, types, events,
                                         from_states, to_states, attempts, worker_ids, data,
                                         jobs)
        SELECT evora.next_seqs(count(*)), updated_at, array_agg(id), array_agg(version),
               array_agg(queue), array_agg(type),
               array_agg(CASE WHEN state = 'PENDING' THEN 'dependencies_met' ELSE 'cancelled' END),
               array_fill('WAITING'::evora.job_state, ARRAY[count(*)::int]), array_agg(state),
               array_agg(attempt), array_fill(NULL::text, ARRAY[count(*)::int]),
               CASE WHEN bool_or(state = 'CANCELLED') THEN
                   array_agg(CASE WHEN state = 'CANCELLED'
                                  THEN jsonb_build_object('reason', 'dependency_cancelled',
                                                          'dependency', cause)
                                  ELSE '{}'::jsonb END) END,
               array_agg(image)
        FROM settled
        WHERE state <> 'WAITING'
        GROUP BY updated_at
    )
    SELECT count(pg_notify('evora_jobs', q.queue))
    INTO hinted
    FROM (SELECT DISTINCT queue FROM settled WHERE state = 'PENDING') q;
    PERFORM set_config('evora.settling', '', true);
    RETURN NULL;
END
$$;

CREATE FUNCTION evora.settle_suspended(j evora.jobs, cb evora.callbacks, how text, payload jsonb) RETURNS evora.move
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION evora.settlement(ended_ids uuid[], ended_states evora.job_state[]) RETURNS TABLE(id uuid, state evora.job_state, arrived integer, cause uuid)
    LANGUAGE sql STABLE
    AS $$
    WITH RECURSIVE cancelled(id) AS (
        SELECT d.job_id
        FROM unnest(ended_ids, ended_states) AS e(id, state)
        JOIN evora.job_dependencies d ON d.depends_on = e.id
        JOIN evora.jobs w ON w.id = d.job_id
        WHERE e.state = 'CANCELLED' AND w.state = 'WAITING'
          AND evora.dependent_next_state(w, 0, true) = 'CANCELLED'
        UNION
        SELECT d.job_id
        FROM cancelled c
        JOIN evora.job_dependencies d ON d.depends_on = c.id
        JOIN evora.jobs w ON w.id = d.job_id
        WHERE w.state = 'WAITING' AND evora.dependent_next_state(w, 0, true) = 'CANCELLED'
    ),
    ended AS (
        SELECT e.id, e.state FROM unnest(ended_ids, ended_states) AS e(id, state)
        UNION ALL
        SELECT c.id, 'CANCELLED'::evora.job_state FROM cancelled c
    ),
    arrivals AS (
        SELECT d.job_id AS id, count(*)::integer AS arrived,
               (array_agg(e.id ORDER BY e.id) FILTER (WHERE e.state = 'CANCELLED'))[1] AS cause
        FROM ended e
        JOIN evora.job_dependencies d ON d.depends_on = e.id
        GROUP BY d.job_id
    )
    SELECT w.id, evora.dependent_next_state(w, a.arrived, a.cause IS NOT NULL), a.arrived,
           a.cause
    FROM arrivals a
    JOIN evora.jobs w ON w.id = a.id
    WHERE w.state = 'WAITING'
$$;

CREATE FUNCTION evora.spawned_tree(parent uuid) RETURNS SETOF uuid
    LANGUAGE sql STABLE
    AS $$
    WITH RECURSIVE tree (id) AS (
        SELECT parent
        UNION
        SELECT s.child FROM tree t JOIN evora.spawned_children s ON s.parent = t.id
        WHERE NOT EXISTS (
            SELECT 1 FROM evora.waiting_dependents(s.child) AS w(id)
            WHERE w.id <> s.parent
              AND (SELECT o.child FROM evora.spawned_children o
                   WHERE o.parent = s.parent AND o.child = w.id) IS NULL)
    )
    SELECT j.id FROM tree t JOIN evora.jobs j ON j.id = t.id
    WHERE t.id <> parent AND j.state IN ('PENDING', 'WAITING', 'RUNNING', 'SUSPENDED')
$$;

CREATE FUNCTION evora.store_submissions(ids uuid[], queues text[], types text[], payloads jsonb[], priorities smallint[], run_ats timestamp with time zone[], delays double precision[], max_attempts integer[], leases integer[], backoff_initials double precision[], backoff_maxes double precision[], backoff_multipliers double precision[], expires_ats timestamp with time zone[], idempotency_keys text[], group_keys text[], before_0011 bytea[], quiet text[], dependency_ords integer[], dependency_ids uuid[], on_failures text[], limit_key_ords integer[], limit_key_names text[], max_durations integer[] DEFAULT NULL::integer[], fairness_keys text[] DEFAULT NULL::text[], debounce_keys text[] DEFAULT '{}'::text[], debounce_delays double precision[] DEFAULT '{}'::double precision[], debounce_max_delays double precision[] DEFAULT '{}'::double precision[], throttle_keys text[] DEFAULT '{}'::text[], throttle_windows double precision[] DEFAULT '{}'::double precision[]) RETURNS TABLE(ord integer, outcome text, first_ord integer, job evora.jobs, notified text[], owed text[])
    LANGUAGE plpgsql
    SET random_page_cost TO '1'
    SET search_path TO 'evora', 'pg_temp'
    AS $$
DECLARE
    fingerprints bytea[];
    kept uuid[];
    replays uuid[];
    waited uuid[];
    lefts integer[];
    refusals text[];
    culprits integer[];
    created integer[];
    absorbed integer[] := '{}';
    answers text[];
    answering uuid[];
BEGIN
    waited := dependency_ids;
    IF array_remove(debounce_keys, NULL) <> '{}' OR array_remove(throttle_keys, NULL) <> '{}' THEN
        SELECT coalesce(array_agg(a.item), '{}'), array_agg(a.answer), array_agg(a.by_job)
        INTO absorbed, answers, answering
        FROM evora.debounce_and_throttle(ids, queues, payloads, debounce_keys, debounce_delays,
                                         debounce_max_delays, throttle_keys, throttle_windows) a;
        delays := ARRAY(SELECT coalesce(d.debounce, d.delay)
                        FROM unnest(delays, debounce_delays) WITH ORDINALITY AS d(delay, debounce, n)
                        ORDER BY d.n);
    END IF;
    IF array_remove(idempotency_keys, NULL) <> '{}' THEN
        fingerprints := evora.submission_fingerprints(
            ids, queues, types, payloads, priorities, run_ats, delays, max_attempts, leases,
            backoff_initials, backoff_maxes, backoff_multipliers, expires_ats,
            idempotency_keys, group_keys, dependency_ords, dependency_ids, on_failures,
            limit_key_ords, limit_key_names, max_durations);
        WITH keyed AS (
            INSERT INTO evora.idempotency_keys (queue, key, fingerprint, job_id)
            SELECT DISTINCT ON (x.queue, x.key) x.queue, x.key, x.fingerprint, x.id
            FROM unnest(ids, queues, idempotency_keys, fingerprints)
                WITH ORDINALITY AS x(id, queue, key, fingerprint, ord)
            WHERE x.key IS NOT NULL
            ORDER BY x.queue, x.key, x.ord
            ON CONFLICT (queue, key) DO NOTHING
            RETURNING job_id
        )
        SELECT coalesce(array_agg(k.job_id), '{}') INTO kept FROM keyed k;
        replays := ARRAY(
            SELECT CASE WHEN k.job_id <> x.id AND k.fingerprint IN (x.fingerprint, x.before)
                        THEN k.job_id END
            FROM unnest(ids, queues, idempotency_keys, fingerprints, before_0011)
                WITH ORDINALITY AS x(id, queue, key, fingerprint, before, ord)
            LEFT JOIN evora.idempotency_keys k
                ON k.queue = x.queue AND k.key = x.key AND k.key = ANY(idempotency_keys)
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
            SELECT * FROM evora.hold_dependencies(ARRAY(
                SELECT DISTINCT d FROM unnest(waited) d
                WHERE d NOT IN (SELECT unnest(ids))))
        ),
        edge AS (
            SELECT e.ord, row_number() OVER (PARTITION BY e.ord ORDER BY e.n) AS place,
                   e.dep IN (SELECT unnest(ids)) AS in_call, h.state,
                   coalesce(on_failures[e.ord], 'cancel') AS policy
            FROM (SELECT DISTINCT ON (u.ord, u.dep) u.*
                  FROM unnest(dependency_ords, waited) WITH ORDINALITY AS u(ord, dep, n)
                  ORDER BY u.ord, u.dep, u.n) AS e
            LEFT JOIN held h ON h.id = e.dep
        ),
        verdict AS (
            SELECT e.ord,
                   count(*) FILTER (
                       WHERE e.in_call OR e.state NOT IN ('COMPLETED', 'CANCELLED'))::integer
                       AS left_count,
                   (array_agg(CASE WHEN e.state IS NULL THEN 'unknown_dependency'
                                   ELSE 'cancelled_dependency' END ORDER BY e.place)
                        FILTER (WHERE e.refused))[1] AS refusal,
                   min(e.place) FILTER (WHERE e.refused)::integer AS place
            FROM (SELECT e.*,
                         NOT e.in_call AND (e.state IS NULL
                                            OR (e.state = 'CANCELLED' AND e.policy = 'cancel'))
                             AS refused
                  FROM edge e) AS e
            GROUP BY e.ord
        )
        SELECT array_agg(coalesce(v.left_count, 0) ORDER BY i.n),
               array_agg(v.refusal ORDER BY i.n), array_agg(v.place ORDER BY i.n)
        INTO lefts, refusals, culprits
        FROM generate_series(1, cardinality(ids)) AS i(n)
        LEFT JOIN verdict v ON v.ord = i.n;
        IF kept IS NOT NULL AND array_remove(refusals, NULL) <> '{}' THEN
            DELETE FROM evora.idempotency_keys k
            USING unnest(ids, queues, idempotency_keys, refusals) AS x(id, queue, key, refusal)
            WHERE x.refusal IS NOT NULL AND k.queue = x.queue AND k.key = x.key
              AND k.job_id = x.id AND k.key = ANY(idempotency_keys);
        END IF;
    END IF;
    created := ARRAY(
        SELECT x.ord::integer
        FROM unnest(ids, idempotency_keys, refusals) WITH ORDINALITY AS x(id, key, refusal, ord)
        WHERE x.refusal IS NULL AND (x.key IS NULL OR x.id IN (SELECT unnest(kept)))
          AND x.ord NOT IN (SELECT unnest(absorbed))
        ORDER BY x.id);
    IF EXISTS (SELECT 1 FROM evora.flow_limits WHERE max_pending IS NOT NULL) THEN
        PERFORM evora.admit(queues, created, limit_key_ords, limit_key_names);
    END IF;
    IF array_remove(fairness_keys, NULL) <> '{}' THEN
        PERFORM evora.fair_note(ARRAY(SELECT queues[c] FROM unnest(created) AS c),
                                ARRAY(SELECT fairness_keys[c] FROM unnest(created) AS c),
                                array_fill(0, ARRAY[cardinality(created)]),
                                array_fill(0::float8, ARRAY[cardinality(created)]));
    END IF;
    RETURN QUERY
    WITH lists AS (
        SELECT e.ord, array_agg(e.dep ORDER BY e.n) AS deps
        FROM (SELECT DISTINCT ON (u.ord, u.dep) u.*
              FROM unnest(dependency_ords, waited) WITH ORDINALITY AS u(ord, dep, n)
              ORDER BY u.ord, u.dep, u.n) AS e
        GROUP BY e.ord
    ),
    moved AS (
        INSERT INTO evora.jobs AS j (id, queue, type, payload, priority, run_at, max_attempts,
                               lease_seconds, backoff_initial, backoff_max, backoff_multiplier,
                               expires_at, idempotency_key, group_key, state, dependencies_left,
                               on_dependency_failure, has_dependents, depends_on, limit_keys,
                               max_duration_seconds, fairness_key)
        SELECT x.id, x.queue, x.type, x.payload, x.priority,
               coalesce(x.run_at, evora.clock_now() + make_interval(secs => coalesce(x.delay, 0))),
               x.max_attempts, x.lease_seconds,
               nullif(x.backoff_initial, (evora.limits() -> 'backoff' ->> 'initial_seconds')::float8),
               nullif(x.backoff_max, (evora.limits() -> 'backoff' ->> 'max_seconds')::float8),
               nullif(x.backoff_multiplier, (evora.limits() -> 'backoff' ->> 'multiplier')::float8),
               x.expires_at, x.key, x.group_key,
               CASE WHEN coalesce(lefts[x.ord], 0) > 0 THEN 'WAITING' ELSE 'PENDING' END::evora.job_state,
               coalesce(lefts[x.ord], 0), nullif(x.on_failure, 'cancel'),
               x.id IN (SELECT unnest(waited)), l.deps, coalesce(lk.names, '{}'),
               x.max_duration, fairness_keys[x.ord]
        FROM unnest(ids, queues, types, payloads, priorities, run_ats, delays, max_attempts,
                    leases, backoff_initials, backoff_maxes, backoff_multipliers, expires_ats,
                    idempotency_keys, group_keys, on_failures, max_durations)
            WITH ORDINALITY AS x(id, queue, type, payload, priority, run_at, delay,
                                 max_attempts, lease_seconds, backoff_initial, backoff_max,
                                 backoff_multiplier, expires_at, key, group_key, on_failure,
                                 max_duration, ord)
        LEFT JOIN lists l ON l.ord = x.ord
        LEFT JOIN evora.limit_key_lists(limit_key_ords, limit_key_names) lk ON lk.ord = x.ord
        WHERE x.ord IN (SELECT unnest(created))
        ORDER BY x.ord
        RETURNING j.*, j AS whole, evora.job_image(j) AS image
    ),
    edges AS (
        INSERT INTO evora.job_dependencies (job_id, depends_on)
        SELECT m.id, d.dep
        FROM moved m
        CROSS JOIN LATERAL unnest(m.depends_on) AS d(dep)
        WHERE cardinality(waited) > 0  -- else not even a pass over the rows
    ),
    data AS (
        SELECT m.*,
               CASE WHEN m.limit_keys = '{}' AND m.fairness_key IS NULL THEN '{}'::jsonb
                    ELSE jsonb_strip_nulls(jsonb_build_object(
                             'limit_keys', nullif(m.limit_keys, '{}'),
                             'fairness_key', m.fairness_key)) END
               || coalesce(nullif(current_setting('evora.submitted_data', true), '')::jsonb,
                           '{}') AS event_data
        FROM moved m
    ),
    recorded AS (
        INSERT INTO evora.event_batches (seqs, at, job_ids, job_versions, queues, types, events,
                                         from_states, to_states, attempts, worker_ids, data,
                                         jobs)
        SELECT evora.next_seqs(count(*)), d.updated_at, array_agg(d.id), array_agg(d.version),
               array_agg(d.queue), array_agg(d.type),
               array_fill('submitted'::text, ARRAY[count(*)::int]),
               array_fill(NULL::evora.job_state, ARRAY[count(*)::int]), array_agg(d.state),
               array_agg(d.attempt), array_fill(NULL::text, ARRAY[count(*)::int]),
               CASE WHEN bool_or(d.event_data <> '{}') THEN array_agg(d.event_data) END,
               array_agg(d.image)
        FROM data d
        GROUP BY d.updated_at
    ),
    claimable AS (
        SELECT DISTINCT m.queue AS q FROM moved m
        WHERE m.state = 'PENDING' OR m.group_key IS NOT NULL
    ),
    hinted AS (
        SELECT c.q, pg_notify('evora_jobs', c.q) AS sent FROM claimable c
        WHERE c.q <> ALL(quiet)
    )
    SELECT created[m.rank::integer], 'created'::text, NULL::integer, m.whole,
           (SELECT array_agg(h.q) FROM hinted h),
           (SELECT array_agg(c.q) FROM claimable c WHERE c.q = ANY(quiet))
    FROM (SELECT r.whole, row_number() OVER (ORDER BY r.id) AS rank FROM moved r) AS m;
    IF cardinality(created) = cardinality(ids) THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT x.ord::integer, x.refusal, culprits[x.ord], NULL::evora.jobs, NULL::text[], NULL::text[]
    FROM unnest(refusals) WITH ORDINALITY AS x(refusal, ord)
    WHERE x.refusal IS NOT NULL;
    RETURN QUERY
    SELECT a.item, a.answer, NULL::integer, s, NULL::text[], NULL::text[]
    FROM unnest(absorbed, answers, answering) AS a(item, answer, by_job)
    JOIN evora.jobs s ON s.id = a.by_job;
    RETURN QUERY
    SELECT x.ord::integer,
           CASE
               WHEN s.id IS NULL THEN 'gone'
               WHEN k.fingerprint IN (x.fingerprint, x.before) THEN 'replayed'
               WHEN k.job_id IN (SELECT unnest(ids)) THEN 'repeat_conflict'
               ELSE 'conflict'
           END,
           CASE WHEN k.job_id IN (SELECT unnest(ids)) THEN array_position(ids, k.job_id) END,
           s,
           NULL::text[], NULL::text[]
    FROM unnest(ids, queues, idempotency_keys, fingerprints, before_0011, refusals)
        WITH ORDINALITY AS x(id, queue, key, fingerprint, before, refusal, ord)
    LEFT JOIN evora.idempotency_keys k
        ON k.queue = x.queue AND k.key = x.key AND k.key = ANY(idempotency_keys)
    LEFT JOIN evora.jobs s ON s.id = k.job_id
    WHERE x.key IS NOT NULL AND k.job_id IS DISTINCT FROM x.id AND x.refusal IS NULL;
END
$$;

CREATE FUNCTION evora.submission_fingerprint(queue text, type text, payload jsonb, priority smallint, run_at timestamp with time zone, delay_seconds double precision, max_attempts integer, lease_seconds integer, backoff_initial double precision, backoff_max double precision, backoff_multiplier double precision, expires_at timestamp with time zone, group_key text, limit_keys text[], max_duration integer DEFAULT NULL::integer) RETURNS bytea
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT sha256(
        int4send(length(convert_to(queue, 'UTF8'))) || convert_to(queue, 'UTF8')
        || int4send(length(convert_to(type, 'UTF8'))) || convert_to(type, 'UTF8')
        || coalesce('\x01'::bytea || int4send(length(convert_to(group_key, 'UTF8')))
                    || convert_to(group_key, 'UTF8'), '\x00')
        || int2send(priority) || int4send(max_attempts) || int4send(lease_seconds)
        || coalesce('\x01'::bytea || timestamptz_send(run_at), '\x00')
        || coalesce('\x01'::bytea || float8send(delay_seconds), '\x00')
        || coalesce('\x01'::bytea || timestamptz_send(expires_at), '\x00')
        || float8send(backoff_initial) || float8send(backoff_max)
        || float8send(backoff_multiplier)
        || convert_to(payload::text, 'UTF8')
        || CASE WHEN cardinality(limit_keys) = 0 THEN ''::bytea ELSE '\x02'::bytea || (
               SELECT string_agg(int4send(length(convert_to(k, 'UTF8'))) || convert_to(k, 'UTF8'),
                                 ''::bytea ORDER BY n)
               FROM unnest(limit_keys) WITH ORDINALITY AS u(k, n)) END
        || coalesce('\x04'::bytea || int4send(max_duration), ''::bytea))
$$;

CREATE FUNCTION evora.submission_fingerprints(ids uuid[], queues text[], types text[], payloads jsonb[], priorities smallint[], run_ats timestamp with time zone[], delays double precision[], max_attempts integer[], leases integer[], backoff_initials double precision[], backoff_maxes double precision[], backoff_multipliers double precision[], expires_ats timestamp with time zone[], idempotency_keys text[], group_keys text[], dependency_ords integer[], dependency_ids uuid[], on_failures text[], limit_key_ords integer[], limit_key_names text[], max_durations integer[] DEFAULT NULL::integer[]) RETURNS bytea[]
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    named integer[] := '{}';
    prints bytea[];
    heads bytea[];
    item record;
BEGIN
    IF cardinality(dependency_ids) > 0 THEN
        named := ARRAY(
            SELECT DISTINCT i.ord::integer
            FROM unnest(dependency_ids) AS e(dep)
            JOIN unnest(ids) WITH ORDINALITY AS i(id, ord) ON i.id = e.dep);
    END IF;
    SELECT array_agg(CASE WHEN y.deps IS NULL THEN y.plain
                          WHEN y.items = 0 THEN sha256(y.plain || y.head) END ORDER BY y.ord),
           array_agg(CASE WHEN y.items > 0 THEN y.plain || y.head END ORDER BY y.ord)
    INTO prints, heads
    FROM (
        SELECT x.ord, d.deps, d.items,
               CASE WHEN x.key IS NOT NULL OR x.ord IN (SELECT unnest(named))
                    THEN evora.submission_fingerprint(
                       x.queue, x.type, x.payload, x.priority, x.run_at, x.delay, x.max_attempts,
                       x.lease_seconds, x.backoff_initial, x.backoff_max, x.backoff_multiplier,
                       x.expires_at, x.group_key, coalesce(l.names, '{}'),
                       x.max_duration) END AS plain,
               CASE WHEN d.deps IS NOT NULL
                    THEN '\x03'::bytea
                         || int4send(octet_length(convert_to(coalesce(x.on_failure, 'cancel'),
                                                             'UTF8')))
                         || convert_to(coalesce(x.on_failure, 'cancel'), 'UTF8')
                         || coalesce(d.jobs, ''::bytea) END AS head
        FROM unnest(queues, types, payloads, priorities, run_ats, delays, max_attempts, leases,
                    backoff_initials, backoff_maxes, backoff_multipliers, expires_ats,
                    idempotency_keys, group_keys, on_failures, max_durations)
            WITH ORDINALITY AS x(queue, type, payload, priority, run_at, delay, max_attempts,
                                 lease_seconds, backoff_initial, backoff_max,
                                 backoff_multiplier, expires_at, key, group_key, on_failure,
                                 max_duration, ord)
        LEFT JOIN evora.limit_key_lists(limit_key_ords, limit_key_names) l ON l.ord = x.ord
        LEFT JOIN (
            SELECT e.ord, count(*) AS deps, count(i.ord) AS items,
                   string_agg('\x01'::bytea || uuid_send(e.dep), ''::bytea
                              ORDER BY '\x01'::bytea || uuid_send(e.dep))
                       FILTER (WHERE i.ord IS NULL) AS jobs
            FROM unnest(dependency_ords, dependency_ids) AS e(ord, dep)
            LEFT JOIN unnest(ids) WITH ORDINALITY AS i(id, ord) ON i.id = e.dep
            GROUP BY e.ord
        ) AS d ON d.ord = x.ord
    ) AS y;
    IF array_remove(heads, NULL) <> '{}' THEN
        FOR item IN
            SELECT e.ord, h.head, array_agg(i.ord::integer) AS items,
                   array_agg(coalesce('\x01'::bytea
                                      || int4send(octet_length(convert_to(i.key, 'UTF8')))
                                      || convert_to(i.key, 'UTF8'), '\x00')) AS item_keys
            FROM unnest(dependency_ords, dependency_ids) AS e(ord, dep)
            JOIN unnest(ids, idempotency_keys) WITH ORDINALITY AS i(id, key, ord) ON i.id = e.dep
            JOIN unnest(heads) WITH ORDINALITY AS h(head, ord) ON h.ord = e.ord
            WHERE h.head IS NOT NULL
            GROUP BY e.ord, h.head
            ORDER BY e.ord
        LOOP
            IF cardinality(item.items) = 1 THEN
                prints[item.ord] := sha256(item.head || '\x02'::bytea || prints[item.items[1]]
                                           || item.item_keys[1]);
            ELSE
                prints[item.ord] := sha256(item.head || (
                    SELECT string_agg(n.repr, ''::bytea ORDER BY n.repr)
                    FROM (SELECT '\x02'::bytea || prints[u.ord] || u.key
                          FROM unnest(item.items, item.item_keys) AS u(ord, key)) AS n(repr)));
            END IF;
        END LOOP;
    END IF;
    IF named = '{}' THEN
        RETURN prints;
    END IF;
    RETURN ARRAY(
        SELECT CASE WHEN x.key IS NOT NULL THEN x.print END
        FROM unnest(idempotency_keys, prints) WITH ORDINALITY AS x(key, print, ord)
        ORDER BY x.ord);
END
$$;

CREATE FUNCTION evora.submit(queue text, type text, payload jsonb DEFAULT '{}'::jsonb, options jsonb DEFAULT '{}'::jsonb) RETURNS uuid
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'evora', 'pg_temp'
    AS $$
DECLARE
    given text;
BEGIN
    IF payload IS NULL THEN
        RAISE EXCEPTION 'payload: must not be SQL NULL (a JSON null is ''null''::jsonb)'
            USING ERRCODE = 'not_null_violation', COLUMN = 'payload';
    END IF;
    IF options IS NULL OR jsonb_typeof(options) <> 'object' THEN
        PERFORM evora.reject('options', 'must be a JSON object');
    END IF;
    FOR given IN SELECT jsonb_object_keys(options) LOOP
        IF given IN ('queue', 'type', 'payload') THEN
            PERFORM evora.reject('options.' || given, 'is an argument of its own');
        END IF;
    END LOOP;
    RETURN (evora.submit_items(jsonb_build_array(options || jsonb_build_object(
        'queue', queue, 'type', type, 'payload', payload)), false))[1];
END
$$;

CREATE FUNCTION evora.submit_batch(jobs jsonb) RETURNS uuid[]
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'evora', 'pg_temp'
    AS $$
DECLARE
    most CONSTANT integer := (evora.limits() ->> 'max_batch')::integer;
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array'
            OR jsonb_array_length(jobs) NOT BETWEEN 1 AND most THEN
        PERFORM evora.reject('jobs', format('must be a JSON array of 1 to %s submissions', most));
    END IF;
    RETURN evora.submit_items(jobs, true);
END
$$;

CREATE FUNCTION evora.submit_items(items jsonb, batch boolean) RETURNS uuid[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    subs evora.submission[];
    new_ids uuid[];
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
    new_ids := ARRAY(SELECT g.id FROM (SELECT evora.uuid7() AS id
                                        FROM generate_series(1, cardinality(subs))) AS g
                     ORDER BY g.id);
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
            ARRAY(SELECT (s).on_dependency_failure FROM unnest(subs) s),
            ARRAY(SELECT i FROM generate_series(1, cardinality(subs)) AS i,
                                unnest((subs[i]).limit_keys) WITH ORDINALITY AS k(name, place)
                  ORDER BY i, k.place),
            ARRAY(SELECT k.name FROM generate_series(1, cardinality(subs)) AS i,
                                     unnest((subs[i]).limit_keys) WITH ORDINALITY AS k(name, place)
                  ORDER BY i, k.place),
            ARRAY(SELECT (s).max_duration_seconds FROM unnest(subs) s),
            ARRAY(SELECT (s).fairness_key FROM unnest(subs) s),
            ARRAY(SELECT (s).debounce_key FROM unnest(subs) s),
            ARRAY(SELECT (s).debounce_delay FROM unnest(subs) s),
            ARRAY(SELECT (s).debounce_max_delay FROM unnest(subs) s),
            ARRAY(SELECT (s).throttle_key FROM unnest(subs) s),
            ARRAY(SELECT (s).throttle_window FROM unnest(subs) s))
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

CREATE FUNCTION evora.suspend_job(job_id uuid, lease_token uuid, timeout_seconds double precision, on_timeout text, suppressed text[]) RETURNS TABLE(outcome text, job evora.jobs, callback_secret text, notified text[], owed text[])
    LANGUAGE plpgsql ROWS 1
    AS $$
DECLARE
    at CONSTANT timestamptz := evora.clock_now();
    deadline CONSTANT timestamptz := at + make_interval(secs => timeout_seconds);
    cb_id CONSTANT uuid := gen_random_uuid();
    secret text;
    j evora.jobs;
BEGIN
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

CREATE FUNCTION evora.take_ended_dependencies() RETURNS uuid[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    full_chunks CONSTANT integer := coalesce(
        nullif(current_setting('evora.ended_dependency_chunks', true), ''), '0')::integer;
    noted text;
BEGIN
    SELECT string_agg(current_setting('evora.ended_dependencies_' || n), '' ORDER BY n)
    INTO noted
    FROM generate_series(1, full_chunks) AS n;
    noted := concat(noted, current_setting('evora.ended_dependencies'));
    PERFORM set_config('evora.ended_dependencies_' || n, '', true)
    FROM generate_series(1, full_chunks) AS n;
    PERFORM set_config('evora.ended_dependency_chunks', '', true);
    PERFORM set_config('evora.ended_dependencies', '', true);
    RETURN string_to_array(rtrim(noted, ','), ',')::uuid[];
END
$$;

CREATE FUNCTION evora.text_field(value jsonb, field text, pattern text, max_length integer, optional boolean) RETURNS text
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    t text;
BEGIN
    IF value IS NULL OR jsonb_typeof(value) = 'null' THEN
        IF optional THEN
            RETURN NULL;
        END IF;
        RAISE EXCEPTION '%: is required', field
            USING ERRCODE = 'not_null_violation', COLUMN = field;
    END IF;
    IF jsonb_typeof(value) <> 'string' THEN
        PERFORM evora.reject(field, 'must be a string');
    END IF;
    t := value #>> '{}';
    IF pattern IS NOT NULL AND t !~ pattern THEN
        PERFORM evora.reject(field, format('must match %s', pattern));
    END IF;
    IF max_length IS NOT NULL AND char_length(t) NOT BETWEEN 1 AND max_length THEN
        PERFORM evora.reject(field, format('must be 1 to %s characters', max_length));
    END IF;
    RETURN t;
END
$$;

CREATE FUNCTION evora.timestamp_field(value jsonb, field text) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE
    AS $_$
DECLARE
    parsed timestamptz;
BEGIN
    IF jsonb_typeof(value) = 'null' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(value) <> 'string' OR value #>> '{}' !~
            '^\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d(:\d\d(\.\d+)?)?([Zz]|[+-]\d\d(:?\d\d)?)$' THEN
        PERFORM evora.reject(field, 'must be an RFC 3339 timestamp with an offset');
    END IF;
    BEGIN
        parsed := (value #>> '{}')::timestamptz;
    EXCEPTION WHEN data_exception THEN
        PERFORM evora.reject(field, 'is not a valid timestamp');
    END;
    IF parsed <= '0001-01-01 00:00:00+00' OR parsed >= '9999-12-31 23:59:59.999999+00' THEN
        PERFORM evora.reject(field, 'is out of range once converted to UTC');
    END IF;
    RETURN parsed;
END
$_$;

CREATE TABLE evora.flow_buckets (
    key text NOT NULL,
    tokens double precision NOT NULL,
    refilled_at timestamp with time zone NOT NULL,
    throttled_until timestamp with time zone
);

CREATE FUNCTION evora.tokens(b evora.flow_buckets, rate_limit integer, rate_per_seconds double precision, at timestamp with time zone) RETURNS double precision
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE WHEN b.throttled_until > at THEN 0::float8
                ELSE least(rate_limit::float8,
                           b.tokens + greatest(0, extract(epoch FROM at - b.refilled_at))
                                      * rate_limit / rate_per_seconds) END
$$;

CREATE FUNCTION evora.uuid7() RETURNS uuid
    LANGUAGE sql PARALLEL SAFE
    AS $$
    SELECT encode(overlay(uuid_send(gen_random_uuid())
        PLACING int8send(((t.us / 1000) << 16) | 28672 | ((t.us % 1000) * 4096 / 1000))
        FROM 1 FOR 8), 'hex')::uuid
    FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8 AS us) AS t
$$;

CREATE FUNCTION evora.validated(item jsonb, at text) RETURNS evora.submission
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    lim CONSTANT jsonb := evora.limits();
    s evora.submission;
    field text;
    value jsonb;
    delay jsonb := 'null';
    backoff jsonb := '{}';
    debounce jsonb := 'null';
    throttle jsonb := 'null';
BEGIN
    IF item IS NULL OR jsonb_typeof(item) <> 'object' THEN
        PERFORM evora.reject(coalesce(nullif(rtrim(at, '.'), ''), 'submission'),
                             'must be a JSON object');
    END IF;
    s.queue := evora.text_field(item -> 'queue', at || 'queue', lim ->> 'queue_pattern', NULL,
                                false);
    s.type := evora.text_field(item -> 'type', at || 'type', lim ->> 'type_pattern', NULL,
                               false);
    s.payload := '{}';
    s.priority := (lim -> 'priority' ->> 'default')::smallint;
    s.max_attempts := (lim -> 'max_attempts' ->> 'default')::integer;
    s.lease_seconds := (lim -> 'lease_seconds' ->> 'default')::integer;
    s.limit_keys := '{}';
    FOR field, value IN SELECT * FROM jsonb_each(item) LOOP
        CASE field
        WHEN 'queue', 'type' THEN
            NULL;
        WHEN 'payload' THEN
            s.payload := evora.client_json(value, at || field);
        WHEN 'priority' THEN
            s.priority := evora.number_field(value, at || field,
                (lim -> field ->> 'min')::numeric, (lim -> field ->> 'max')::numeric, true);
        WHEN 'max_attempts' THEN
            s.max_attempts := evora.number_field(value, at || field,
                (lim -> field ->> 'min')::numeric, (lim -> field ->> 'max')::numeric, true);
        WHEN 'lease_seconds' THEN
            s.lease_seconds := evora.number_field(value, at || field,
                (lim -> field ->> 'min')::numeric, (lim -> field ->> 'max')::numeric, true);
        WHEN 'max_duration_seconds' THEN
            IF jsonb_typeof(value) <> 'null' THEN
                s.max_duration_seconds := evora.number_field(value, at || field, 1,
                    (lim ->> 'max_seconds')::numeric, true);
            END IF;
        WHEN 'run_at' THEN
            s.run_at := evora.timestamp_field(value, at || field);
        WHEN 'expires_at' THEN
            s.expires_at := evora.timestamp_field(value, at || field);
        WHEN 'delay_seconds' THEN
            delay := value;
        WHEN 'backoff' THEN
            IF jsonb_typeof(value) <> 'object' THEN
                PERFORM evora.reject(at || field, 'must be a JSON object');
            END IF;
            backoff := value;
        WHEN 'idempotency_key' THEN
            s.idempotency_key := evora.text_field(value, at || field, NULL,
                                                  (lim ->> 'key_max_length')::integer, true);
        WHEN 'group_key' THEN
            s.group_key := evora.text_field(value, at || field, NULL,
                                            (lim ->> 'key_max_length')::integer, true);
        WHEN 'limit_keys' THEN
            s.limit_keys := evora.limit_keys_field(value, at || field);
        WHEN 'fairness_key' THEN
            s.fairness_key := evora.text_field(value, at || field, lim ->> 'limit_key_pattern',
                                               NULL, true);
        WHEN 'debounce' THEN
            debounce := value;
        WHEN 'throttle' THEN
            throttle := value;
        ELSE
            PERFORM evora.reject(at || field, 'is not a submission field');
        END CASE;
    END LOOP;
    IF jsonb_typeof(delay) <> 'null' THEN
        s.delay_seconds := evora.number_field(delay, at || 'delay_seconds', 0,
                                              (lim ->> 'max_seconds')::numeric, false);
        IF s.run_at IS NOT NULL THEN
            PERFORM evora.reject(at || 'delay_seconds', 'give run_at or delay_seconds, not both');
        END IF;
    END IF;
    FOR field IN SELECT jsonb_object_keys(backoff) LOOP
        IF field NOT IN ('initial_seconds', 'max_seconds', 'multiplier') THEN
            PERFORM evora.reject(at || 'backoff.' || field, 'is not a backoff field');
        END IF;
    END LOOP;
    s.backoff_initial := coalesce(evora.number_field(backoff -> 'initial_seconds',
        at || 'backoff.initial_seconds', 0, (lim ->> 'max_seconds')::numeric, false, true),
        (lim -> 'backoff' ->> 'initial_seconds')::numeric);
    s.backoff_max := coalesce(evora.number_field(backoff -> 'max_seconds',
        at || 'backoff.max_seconds', 0, (lim ->> 'max_seconds')::numeric, false, true),
        (lim -> 'backoff' ->> 'max_seconds')::numeric);
    s.backoff_multiplier := coalesce(evora.number_field(backoff -> 'multiplier',
        at || 'backoff.multiplier', 1, (lim -> 'backoff' ->> 'max_multiplier')::numeric, false),
        (lim -> 'backoff' ->> 'multiplier')::numeric);
    IF s.backoff_max < s.backoff_initial THEN
        PERFORM evora.reject(at || 'backoff.max_seconds', 'must be >= initial_seconds');
    END IF;
    IF jsonb_typeof(debounce) <> 'null' THEN
        PERFORM evora.object_field(debounce, at || 'debounce',
                                   ARRAY['key', 'delay_seconds', 'max_delay_seconds']);
        s.debounce_key := evora.text_field(debounce -> 'key', at || 'debounce.key', NULL,
                                           (lim ->> 'key_max_length')::integer, false);
        s.debounce_delay := evora.number_field(debounce -> 'delay_seconds',
            at || 'debounce.delay_seconds', 0, (lim ->> 'max_seconds')::numeric, false);
        s.debounce_max_delay := evora.number_field(debounce -> 'max_delay_seconds',
            at || 'debounce.max_delay_seconds', 0, (lim ->> 'max_seconds')::numeric, false,
            true);
        IF s.debounce_max_delay < s.debounce_delay THEN
            PERFORM evora.reject(at || 'debounce.max_delay_seconds', 'must be >= delay_seconds');
        END IF;
        IF s.run_at IS NOT NULL OR s.delay_seconds IS NOT NULL THEN
            PERFORM evora.reject(at || 'debounce',
                                 'sets the run time itself: give no run_at or delay_seconds');
        END IF;
    END IF;
    IF jsonb_typeof(throttle) <> 'null' THEN
        PERFORM evora.object_field(throttle, at || 'throttle', ARRAY['key', 'window_seconds']);
        s.throttle_key := evora.text_field(throttle -> 'key', at || 'throttle.key', NULL,
                                           (lim ->> 'key_max_length')::integer, false);
        s.throttle_window := evora.number_field(throttle -> 'window_seconds',
            at || 'throttle.window_seconds', 0, (lim ->> 'max_seconds')::numeric, false, true);
        IF s.debounce_key IS NOT NULL THEN
            PERFORM evora.reject(at || 'throttle', 'give debounce or throttle, not both');
        END IF;
    END IF;
    IF (s.debounce_key IS NOT NULL OR s.throttle_key IS NOT NULL)
            AND s.idempotency_key IS NOT NULL THEN
        PERFORM evora.reject(at || 'idempotency_key', format(
            'cannot be combined with %s: the key answers an existing job without storing one',
            CASE WHEN s.debounce_key IS NOT NULL THEN 'debounce' ELSE 'throttle' END));
    END IF;
    RETURN s;
END
$$;

CREATE FUNCTION evora.validated_with_dependencies(item jsonb, at text) RETURNS evora.submission
    LANGUAGE plpgsql STABLE
    AS $_$
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
    s.on_dependency_failure := coalesce(item ->> 'on_dependency_failure', 'cancel');
    IF item ? 'on_dependency_failure'
            AND (jsonb_typeof(item -> 'on_dependency_failure') <> 'string'
                 OR s.on_dependency_failure NOT IN ('cancel', 'run')) THEN
        PERFORM evora.reject(at || 'on_dependency_failure', 'must be "cancel" or "run"');
    END IF;
    IF (s.debounce_key IS NOT NULL OR s.throttle_key IS NOT NULL)
            AND (s.ref IS NOT NULL OR jsonb_typeof(item -> 'depends_on') = 'array'
                                      AND jsonb_array_length(item -> 'depends_on') > 0) THEN
        PERFORM evora.reject(at || CASE WHEN s.debounce_key IS NOT NULL THEN 'debounce'
                                        ELSE 'throttle' END,
                             'cannot be combined with depends_on or ref');
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
$_$;

CREATE FUNCTION evora.waiting_dependents(dependency uuid) RETURNS SETOF uuid
    LANGUAGE sql STABLE
    AS $$
    SELECT d.job_id FROM evora.job_dependencies d JOIN evora.jobs w ON w.id = d.job_id
    WHERE d.depends_on = dependency AND w.state = 'WAITING'
$$;

CREATE TABLE evora.event_archive_runs (
    run_id text NOT NULL,
    from_seq bigint NOT NULL,
    upto_seq bigint NOT NULL,
    from_xid xid8 NOT NULL,
    below_xid xid8 NOT NULL,
    events bigint NOT NULL,
    max_seq bigint NOT NULL,
    partitions jsonb NOT NULL,
    committed_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT event_archive_runs_events_check CHECK ((events > 0))
);

CREATE TABLE evora.event_archive_watermark (
    singleton boolean DEFAULT true NOT NULL,
    upto_seq bigint NOT NULL,
    below_xid xid8 NOT NULL,
    archived bigint NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT event_archive_watermark_archived_check CHECK ((archived >= 0)),
    CONSTRAINT event_archive_watermark_singleton_check CHECK (singleton),
    CONSTRAINT event_archive_watermark_upto_seq_check CHECK ((upto_seq >= 0))
);

CREATE TABLE evora.fair_keys (
    queue text NOT NULL,
    key text NOT NULL,
    vfinish double precision NOT NULL,
    est double precision DEFAULT 1 NOT NULL,
    outstanding double precision DEFAULT 0 NOT NULL,
    running integer DEFAULT 0 NOT NULL,
    backlogged boolean DEFAULT true NOT NULL,
    served bigint DEFAULT 0 NOT NULL,
    held_seconds double precision DEFAULT 0 NOT NULL
);

CREATE TABLE evora.fair_ledger (
    queue text NOT NULL,
    key text NOT NULL,
    ended integer NOT NULL,
    held double precision NOT NULL
);

CREATE TABLE evora.fair_queues (
    queue text NOT NULL,
    vtime double precision DEFAULT 0 NOT NULL
);

CREATE TABLE evora.fairness_weights (
    key text NOT NULL,
    weight double precision NOT NULL,
    stem text GENERATED ALWAYS AS (
CASE
    WHEN (key ~~ '%*'::text) THEN "left"(key, '-1'::integer)
    ELSE NULL::text
END) STORED,
    changed_at timestamp with time zone NOT NULL,
    CONSTRAINT fairness_weights_weight CHECK (((weight >= (0.001)::double precision) AND (weight <= (1000)::double precision)))
);

CREATE TABLE evora.flow_limit_changes (
    seq bigint NOT NULL,
    key text NOT NULL,
    concurrency integer,
    rate_limit integer,
    rate_per_seconds double precision,
    deleted boolean NOT NULL,
    changed_at timestamp with time zone DEFAULT now() NOT NULL,
    max_pending integer
);

ALTER TABLE evora.flow_limit_changes ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME evora.flow_limit_changes_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE evora.flow_limits (
    key text NOT NULL,
    concurrency integer,
    rate_limit integer,
    rate_per_seconds double precision,
    stem text GENERATED ALWAYS AS (
CASE
    WHEN ("right"(key, 1) = '*'::text) THEN "left"(key, '-1'::integer)
    ELSE NULL::text
END) STORED,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    max_pending integer,
    CONSTRAINT flow_limits_concurrency CHECK ((concurrency >= 1)),
    CONSTRAINT flow_limits_max_pending CHECK ((max_pending >= 1)),
    CONSTRAINT flow_limits_rate_limit CHECK ((rate_limit >= 1)),
    CONSTRAINT flow_limits_rate_per_seconds CHECK ((rate_per_seconds > (0)::double precision)),
    CONSTRAINT flow_limits_rate_whole CHECK (((rate_limit IS NULL) = (rate_per_seconds IS NULL)))
);

CREATE TABLE evora.function_files (
    name text NOT NULL,
    checksum text NOT NULL,
    migration integer NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE evora.idempotency_keys (
    queue text NOT NULL,
    key text NOT NULL,
    fingerprint bytea NOT NULL,
    job_id uuid NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE evora.index_builds (
    name text NOT NULL,
    build text NOT NULL
);

CREATE TABLE evora.job_dependencies (
    job_id uuid NOT NULL,
    depends_on uuid NOT NULL,
    CONSTRAINT job_dependencies_not_self CHECK ((job_id <> depends_on))
);

CREATE VIEW evora.job_events AS
 SELECT r.seq,
    r.xid,
    r.job_id,
    r.job_version,
    r.queue,
    r.type,
    r.event,
    r.from_state,
    r.to_state,
    r.attempt,
    r.worker_id,
    r.at,
    r.data,
    r.job
   FROM evora.job_event_rows r
UNION ALL
 SELECT e.seq,
    b.xid,
    e.job_id,
    e.job_version,
    e.queue,
    e.type,
    e.event,
    e.from_state,
    e.to_state,
    e.attempt,
    e.worker_id,
    b.at,
    COALESCE(e.data, '{}'::jsonb) AS data,
    e.job
   FROM (evora.event_batches b
     CROSS JOIN LATERAL ( SELECT unnest(b.seqs) AS seq,
            unnest(b.job_ids) AS job_id,
            unnest(b.job_versions) AS job_version,
            unnest(b.queues) AS queue,
            unnest(b.types) AS type,
            unnest(b.events) AS event,
            unnest(b.from_states) AS from_state,
            unnest(b.to_states) AS to_state,
            unnest(b.attempts) AS attempt,
            unnest(b.worker_ids) AS worker_id,
            unnest(b.data) AS data,
            unnest(b.jobs) AS job) e);

ALTER TABLE evora.job_event_rows ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME evora.job_events_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE evora.job_prune_counts (
    queue text NOT NULL,
    state evora.job_state NOT NULL,
    pruned bigint NOT NULL,
    CONSTRAINT job_prune_counts_finished_only CHECK ((state = ANY (ARRAY['COMPLETED'::evora.job_state, 'CANCELLED'::evora.job_state, 'DLQ'::evora.job_state]))),
    CONSTRAINT job_prune_counts_pruned_check CHECK ((pruned >= 0))
);

CREATE TABLE evora.job_traces (
    job_id uuid NOT NULL,
    traceparent text NOT NULL,
    CONSTRAINT job_traces_traceparent_check CHECK ((length(traceparent) = 55))
);

CREATE TABLE evora.job_transitions (
    from_state evora.job_state,
    to_state evora.job_state NOT NULL,
    event text NOT NULL
);

ALTER TABLE evora.jobs ALTER COLUMN submit_seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME evora.jobs_submit_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE evora.migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE evora.outbox_target (
    only_row boolean DEFAULT true NOT NULL,
    target pg_snapshot NOT NULL,
    taken_at timestamp with time zone NOT NULL,
    CONSTRAINT outbox_target_only_row_check CHECK (only_row)
);

CREATE TABLE evora.paused_queues (
    queue text NOT NULL,
    paused_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE evora.projector_progress (
    generation integer NOT NULL,
    xid xid8 NOT NULL,
    seq bigint DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    snapshot pg_snapshot
);

CREATE TABLE evora.retiring_indexes (
    name text NOT NULL,
    replaced_by text NOT NULL
);

CREATE TABLE evora.schedules (
    name text NOT NULL,
    cron text NOT NULL,
    timezone text NOT NULL,
    job jsonb NOT NULL,
    misfire text NOT NULL,
    misfire_grace_seconds integer NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    ticked_until timestamp with time zone NOT NULL,
    next_run_at timestamp with time zone,
    last_run_at timestamp with time zone,
    last_job_id uuid,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    last_error jsonb,
    last_error_at timestamp with time zone,
    failing_since timestamp with time zone,
    consecutive_failures integer DEFAULT 0 NOT NULL,
    CONSTRAINT schedules_misfire_check CHECK ((misfire = ANY (ARRAY['skip'::text, 'run_once'::text, 'catch_up'::text]))),
    CONSTRAINT schedules_misfire_grace_seconds_check CHECK ((misfire_grace_seconds > 0))
);

CREATE TABLE evora.spawned_children (
    parent uuid NOT NULL,
    child uuid NOT NULL
);
ALTER TABLE ONLY evora.spawned_children ALTER COLUMN parent SET (n_distinct=-1);

CREATE TABLE evora.submission_keys (
    queue text NOT NULL,
    kind text NOT NULL,
    key text NOT NULL,
    job_id uuid NOT NULL,
    since timestamp with time zone NOT NULL,
    run_by timestamp with time zone,
    until timestamp with time zone,
    CONSTRAINT submission_keys_kind CHECK ((kind = ANY (ARRAY['debounce'::text, 'throttle'::text]))),
    CONSTRAINT submission_keys_run_by CHECK (((kind = 'debounce'::text) = (run_by IS NOT NULL))),
    CONSTRAINT submission_keys_until CHECK (((kind = 'throttle'::text) = (until IS NOT NULL)))
);

ALTER TABLE ONLY evora.callbacks
    ADD CONSTRAINT callbacks_pkey PRIMARY KEY (id);

ALTER TABLE ONLY evora.callbacks
    ADD CONSTRAINT callbacks_secret_hash_key UNIQUE (secret_hash);

ALTER TABLE ONLY evora.event_archive_runs
    ADD CONSTRAINT event_archive_runs_pkey PRIMARY KEY (run_id);

ALTER TABLE ONLY evora.event_archive_watermark
    ADD CONSTRAINT event_archive_watermark_pkey PRIMARY KEY (singleton);

ALTER TABLE ONLY evora.fair_keys
    ADD CONSTRAINT fair_keys_pkey PRIMARY KEY (queue, key);

ALTER TABLE ONLY evora.fair_queues
    ADD CONSTRAINT fair_queues_pkey PRIMARY KEY (queue);

ALTER TABLE ONLY evora.fairness_weights
    ADD CONSTRAINT fairness_weights_pkey PRIMARY KEY (key);

ALTER TABLE ONLY evora.flow_buckets
    ADD CONSTRAINT flow_buckets_pkey PRIMARY KEY (key);

ALTER TABLE ONLY evora.flow_limit_changes
    ADD CONSTRAINT flow_limit_changes_pkey PRIMARY KEY (seq);

ALTER TABLE ONLY evora.flow_limits
    ADD CONSTRAINT flow_limits_pkey PRIMARY KEY (key);

ALTER TABLE ONLY evora.function_files
    ADD CONSTRAINT function_files_pkey PRIMARY KEY (name);

ALTER TABLE ONLY evora.idempotency_keys
    ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (queue, key);

ALTER TABLE ONLY evora.index_builds
    ADD CONSTRAINT index_builds_pkey PRIMARY KEY (name);

ALTER TABLE ONLY evora.job_dependencies
    ADD CONSTRAINT job_dependencies_pkey PRIMARY KEY (job_id, depends_on);

ALTER TABLE ONLY evora.job_event_rows
    ADD CONSTRAINT job_events_version_once UNIQUE (job_id, job_version, at);

ALTER TABLE ONLY evora.job_prune_counts
    ADD CONSTRAINT job_prune_counts_pkey PRIMARY KEY (queue, state);

ALTER TABLE ONLY evora.job_traces
    ADD CONSTRAINT job_traces_pkey PRIMARY KEY (job_id);

ALTER TABLE ONLY evora.job_transitions
    ADD CONSTRAINT job_transitions_from_state_to_state_event_key UNIQUE (from_state, to_state, event);

ALTER TABLE ONLY evora.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY evora.migrations
    ADD CONSTRAINT migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY evora.outbox_target
    ADD CONSTRAINT outbox_target_pkey PRIMARY KEY (only_row);

ALTER TABLE ONLY evora.paused_queues
    ADD CONSTRAINT paused_queues_pkey PRIMARY KEY (queue);

ALTER TABLE ONLY evora.projector_progress
    ADD CONSTRAINT projector_progress_pkey PRIMARY KEY (generation);

ALTER TABLE ONLY evora.retiring_indexes
    ADD CONSTRAINT retiring_indexes_pkey PRIMARY KEY (name);

ALTER TABLE ONLY evora.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (name);

ALTER TABLE ONLY evora.spawned_children
    ADD CONSTRAINT spawned_children_pkey PRIMARY KEY (parent, child);

ALTER TABLE ONLY evora.submission_keys
    ADD CONSTRAINT submission_keys_pkey PRIMARY KEY (queue, kind, key);

CREATE INDEX callbacks_due ON evora.callbacks USING btree (timeout_at) WHERE (outcome IS NULL);

CREATE INDEX callbacks_job ON evora.callbacks USING btree (job_id);

CREATE INDEX event_batches_job_times ON ONLY evora.event_batches USING gin (evora.job_id_times(job_ids)) WITH (fastupdate=off);

CREATE INDEX event_batches_seq ON ONLY evora.event_batches USING brin (seq, last_seq) WITH (pages_per_range='32', autosummarize='on');

CREATE INDEX event_batches_tail ON ONLY evora.event_batches USING btree (xid, last_seq);

CREATE INDEX fair_keys_turn ON evora.fair_keys USING btree (queue, vfinish, key) WHERE backlogged;

CREATE INDEX fair_ledger_queue ON evora.fair_ledger USING btree (queue);

CREATE INDEX fairness_weights_prefixes ON evora.fairness_weights USING btree (stem) WHERE (stem IS NOT NULL);

CREATE INDEX flow_buckets_throttled ON evora.flow_buckets USING btree (throttled_until) WHERE (throttled_until IS NOT NULL);

CREATE INDEX flow_limits_prefixes ON evora.flow_limits USING btree (stem) WHERE (stem IS NOT NULL);

CREATE INDEX idempotency_keys_age ON evora.idempotency_keys USING btree (created_at);

CREATE INDEX job_dependencies_dependents ON evora.job_dependencies USING btree (depends_on, job_id);

CREATE INDEX job_events_seq ON ONLY evora.job_event_rows USING brin (seq) WITH (pages_per_range='32', autosummarize='on');

CREATE INDEX job_events_tail ON ONLY evora.job_event_rows USING btree (xid, seq);

CREATE INDEX jobs_claimable ON evora.jobs USING btree (queue, priority, run_at, submit_seq) WHERE (state = 'PENDING'::evora.job_state);

CREATE INDEX jobs_delayed ON evora.jobs USING btree (queue, run_at) WHERE ((state = 'PENDING'::evora.job_state) AND (run_at > created_at));

CREATE INDEX jobs_fair_backlog ON evora.jobs USING btree (queue, fairness_key, priority, run_at, submit_seq) WHERE ((state = ANY (ARRAY['PENDING'::evora.job_state, 'WAITING'::evora.job_state])) AND (fairness_key IS NOT NULL));

CREATE INDEX jobs_finished ON evora.jobs USING btree (state, finished_at) WHERE (state = ANY (ARRAY['COMPLETED'::evora.job_state, 'CANCELLED'::evora.job_state, 'DLQ'::evora.job_state]));

CREATE INDEX jobs_group_pending ON evora.jobs USING btree (queue, group_key, priority, submit_seq) WHERE ((state = 'PENDING'::evora.job_state) AND (group_key IS NOT NULL));

CREATE UNIQUE INDEX jobs_group_running ON evora.jobs USING btree (queue, group_key) WHERE ((state = ANY (ARRAY['RUNNING'::evora.job_state, 'SUSPENDED'::evora.job_state])) AND (group_key IS NOT NULL));

CREATE INDEX jobs_listing_by_id ON evora.jobs USING btree (queue, state, id) WHERE (state <> 'RUNNING'::evora.job_state);

CREATE INDEX jobs_pending_ttl ON evora.jobs USING btree (expires_at) WHERE ((state = 'PENDING'::evora.job_state) AND (expires_at IS NOT NULL) AND (started_at IS NULL));

CREATE INDEX jobs_running_lease ON evora.jobs USING btree (lease_expires_at) WHERE (state = 'RUNNING'::evora.job_state);

CREATE INDEX jobs_running_limit_keys ON evora.jobs USING gin (limit_keys) WITH (fastupdate=off) WHERE ((state >= 'RUNNING'::evora.job_state) AND (state <= 'RUNNING'::evora.job_state) AND (limit_keys <> '{}'::text[]));

CREATE INDEX jobs_running_time_limit ON evora.jobs USING btree (started_at) WHERE ((state = 'RUNNING'::evora.job_state) AND (max_duration_seconds IS NOT NULL));

CREATE INDEX jobs_waiting_limit_keys ON evora.jobs USING gin (limit_keys) WITH (fastupdate=off) WHERE ((state = ANY (ARRAY['PENDING'::evora.job_state, 'WAITING'::evora.job_state])) AND (limit_keys <> '{}'::text[]));

CREATE INDEX schedules_due ON evora.schedules USING btree (next_run_at) WHERE (NOT paused);

CREATE INDEX submission_keys_debounce_since ON evora.submission_keys USING btree (since) WHERE (kind = 'debounce'::text);

CREATE INDEX submission_keys_throttle_until ON evora.submission_keys USING btree (until) WHERE (kind = 'throttle'::text);

CREATE TRIGGER event_batches_append_only BEFORE DELETE OR UPDATE ON evora.event_batches FOR EACH ROW EXECUTE FUNCTION evora.reject_event_change();

CREATE TRIGGER event_batches_no_truncate BEFORE TRUNCATE ON evora.event_batches FOR EACH STATEMENT EXECUTE FUNCTION evora.reject_event_change();

CREATE TRIGGER flow_limits_history AFTER INSERT OR DELETE OR UPDATE ON evora.flow_limits FOR EACH ROW EXECUTE FUNCTION evora.record_limit_change();

CREATE TRIGGER job_events_append_only BEFORE DELETE OR UPDATE ON evora.job_event_rows FOR EACH ROW EXECUTE FUNCTION evora.reject_event_change();

CREATE TRIGGER job_events_insert INSTEAD OF INSERT ON evora.job_events FOR EACH ROW EXECUTE FUNCTION evora.insert_event_row();

CREATE TRIGGER job_events_no_truncate BEFORE TRUNCATE ON evora.job_event_rows FOR EACH STATEMENT EXECUTE FUNCTION evora.reject_event_change();

CREATE TRIGGER job_events_view_append_only INSTEAD OF DELETE OR UPDATE ON evora.job_events FOR EACH ROW EXECUTE FUNCTION evora.reject_event_change();

CREATE TRIGGER jobs_live_delete_guard BEFORE DELETE ON evora.jobs FOR EACH ROW WHEN ((old.state = ANY (ARRAY['PENDING'::evora.job_state, 'RUNNING'::evora.job_state, 'WAITING'::evora.job_state, 'SUSPENDED'::evora.job_state]))) EXECUTE FUNCTION evora.reject_live_delete();

CREATE TRIGGER jobs_new_state_guard BEFORE INSERT ON evora.jobs FOR EACH ROW WHEN ((new.state <> ALL (ARRAY['PENDING'::evora.job_state, 'WAITING'::evora.job_state]))) EXECUTE FUNCTION evora.reject_illegal_transition();

CREATE TRIGGER jobs_note_ended_dependency AFTER UPDATE OF state ON evora.jobs FOR EACH ROW WHEN ((new.has_dependents AND (new.state = ANY (ARRAY['COMPLETED'::evora.job_state, 'CANCELLED'::evora.job_state])) AND (old.state IS DISTINCT FROM new.state) AND (current_setting('evora.settling'::text, true) IS DISTINCT FROM 'on'::text))) EXECUTE FUNCTION evora.note_ended_dependency();

CREATE TRIGGER jobs_references_removed AFTER DELETE ON evora.jobs REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION evora.remove_job_references();

CREATE TRIGGER jobs_settle_dependents AFTER UPDATE OF state ON evora.jobs FOR EACH STATEMENT EXECUTE FUNCTION evora.settle_dependents();

CREATE TRIGGER jobs_transition_guard AFTER UPDATE OF state ON evora.jobs FOR EACH ROW WHEN (((old.state IS DISTINCT FROM new.state) AND (((((((((((((((((old.state <> 'DLQ'::evora.job_state) OR (new.state <> 'CANCELLED'::evora.job_state)) AND ((old.state <> 'DLQ'::evora.job_state) OR (new.state <> 'PENDING'::evora.job_state))) AND ((old.state <> 'PENDING'::evora.job_state) OR (new.state <> 'CANCELLED'::evora.job_state))) AND ((old.state <> 'PENDING'::evora.job_state) OR (new.state <> 'DLQ'::evora.job_state))) AND ((old.state <> 'PENDING'::evora.job_state) OR (new.state <> 'RUNNING'::evora.job_state))) AND ((old.state <> 'RUNNING'::evora.job_state) OR (new.state <> 'CANCELLED'::evora.job_state))) AND ((old.state <> 'RUNNING'::evora.job_state) OR (new.state <> 'COMPLETED'::evora.job_state))) AND ((old.state <> 'RUNNING'::evora.job_state) OR (new.state <> 'DLQ'::evora.job_state))) AND ((old.state <> 'RUNNING'::evora.job_state) OR (new.state <> 'PENDING'::evora.job_state))) AND ((old.state <> 'RUNNING'::evora.job_state) OR (new.state <> 'SUSPENDED'::evora.job_state))) AND ((old.state <> 'RUNNING'::evora.job_state) OR (new.state <> 'WAITING'::evora.job_state))) AND ((old.state <> 'SUSPENDED'::evora.job_state) OR (new.state <> 'CANCELLED'::evora.job_state))) AND ((old.state <> 'SUSPENDED'::evora.job_state) OR (new.state <> 'DLQ'::evora.job_state))) AND ((old.state <> 'SUSPENDED'::evora.job_state) OR (new.state <> 'PENDING'::evora.job_state))) AND ((old.state <> 'WAITING'::evora.job_state) OR (new.state <> 'CANCELLED'::evora.job_state))) AND ((old.state <> 'WAITING'::evora.job_state) OR (new.state <> 'PENDING'::evora.job_state))))) EXECUTE FUNCTION evora.reject_illegal_transition();
