-- Evora schema, version 11: submitting jobs in SQL, inside the caller's own transaction.
--
-- evora.submit(queue, type, payload, options) and evora.submit_batch(jobs) validate like
-- POST /v1/jobs and store through evora.submit_rows(), which is also what the api's own
-- submissions run: the idempotency rules, the `submitted` event and the NOTIFY hint exist
-- once. A NOTIFY sent inside a transaction is delivered when it commits, and not at all if
-- it rolls back, so a caller's rollback leaves no job, no event and no wake-up.
--
-- The role evora_producer may execute those two functions and nothing else of Evora's; they
-- run as their owner (SECURITY DEFINER) with a search_path fixed to the schema of Evora's
-- tables, then pg_temp, so a caller's own objects cannot stand in for Evora's.
--
-- Written to be re-runnable: every statement replaces or is guarded.

CREATE SCHEMA IF NOT EXISTS evora;

-- Roles belong to the cluster, not the database: another Evora database may have made it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'evora_producer') THEN
        CREATE ROLE evora_producer NOLOGIN;
    END IF;
END
$$;

-- The limits and defaults of a submission. evora.protocol.limits and the api's submission
-- model hold the same numbers; tests/sql/test_limits.py keeps them equal.
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
                    "max_multiplier": 1000}
    }'::jsonb
$$;

-- One submission with every field resolved: what evora.submit_rows() stores.
DO $$
BEGIN
    IF to_regtype('evora.submission') IS NULL THEN
        CREATE TYPE evora.submission AS (
            queue              text,
            type               text,
            payload            jsonb,
            priority           smallint,
            run_at             timestamptz,
            delay_seconds      float8,
            max_attempts       integer,
            lease_seconds      integer,
            backoff_initial    float8,
            backoff_max        float8,
            backoff_multiplier float8,
            expires_at         timestamptz,
            idempotency_key    text,
            group_key          text
        );
    END IF;
END
$$;

-- Identity of a submission for idempotency: every field as given (delay_seconds as a delay,
-- not resolved to a time, so a retry later still matches), defaults filled, the key left
-- out. Numbers and times go in as their binary form, which no session setting (TimeZone,
-- extra_float_digits) changes; texts length-prefixed, nullable fields with a presence byte,
-- and the payload last as PostgreSQL prints its jsonb (keys sorted, duplicates removed).
CREATE OR REPLACE FUNCTION evora.fingerprint(
    queue text, type text, payload jsonb, priority smallint, run_at timestamptz,
    delay_seconds float8, max_attempts integer, lease_seconds integer, backoff_initial float8,
    backoff_max float8, backoff_multiplier float8, expires_at timestamptz, group_key text
) RETURNS bytea
-- STABLE, as convert_to() is: an IMMUTABLE body calling it would not be inlined
LANGUAGE sql STABLE PARALLEL SAFE AS $$
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
        || convert_to(payload::text, 'UTF8'))
$$;

-- A time-ordered UUID (RFC 9562 version 7), as the api makes for its jobs: consecutive ids
-- land on the same primary-key pages. (uuidv7() is built in only from PostgreSQL 18.)
CREATE OR REPLACE FUNCTION evora.uuid7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
                          FROM 3)
        FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$;

-- Stores submissions that are already valid, one array element each, in one statement,
-- and answers each by its position (ord, from 1), the created ones first:
--   created          a new job (its `submitted` event written, its queue hinted)
--   replayed         its idempotency key was stored before with the same fingerprint: the
--                    stored job, in its current state
--   conflict         the key was stored before with another fingerprint
--   repeat_conflict  the key appears earlier in this call (at first_ord) with other fields
--   gone             the key was stored before, but its job has since been removed
-- Keys are inserted in one order whatever the call, so racing calls cannot deadlock, and
-- ON CONFLICT waits for a racing holder of the same key to commit: of any racing
-- submissions exactly one creates the job. `quiet` are queues whose hint the caller sends
-- later itself (storage/notify.py); `notified` and `owed` say which were sent and held back.
-- `before_0011` are the fingerprints the api computed before this migration (in Python, from
-- the request), for keys stored then: a retry of such a submission still replays its job.
CREATE OR REPLACE FUNCTION evora.submit_rows(
    ids uuid[], queues text[], types text[], payloads jsonb[], priorities smallint[],
    run_ats timestamptz[], delays float8[], max_attempts integer[], leases integer[],
    backoff_initials float8[], backoff_maxes float8[], backoff_multipliers float8[],
    expires_ats timestamptz[], idempotency_keys text[], group_keys text[],
    before_0011 bytea[], quiet text[]
) RETURNS TABLE (ord integer, outcome text, first_ord integer, job jobs, notified text[],
                 owed text[])
LANGUAGE plpgsql AS $$
DECLARE
    made integer;
    -- of keyed items only: what a replay is compared by
    fingerprints bytea[];
BEGIN
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
    END IF;
    -- The created items first, straight from the insert ...
    RETURN QUERY
    WITH input AS (
        SELECT x.*, fingerprints[x.ord] AS fingerprint
        FROM unnest(ids, queues, types, payloads, priorities, run_ats, delays, max_attempts,
                    leases, backoff_initials, backoff_maxes, backoff_multipliers,
                    expires_ats, idempotency_keys, group_keys)
            WITH ORDINALITY AS x(id, queue, type, payload, priority, run_at, delay,
                                 max_attempts, lease_seconds, backoff_initial, backoff_max,
                                 backoff_multiplier, expires_at, key, group_key, ord)
    ),
    keyed AS (
        INSERT INTO idempotency_keys (queue, key, fingerprint, job_id)
        -- a key repeated in this call is stored once, for its first appearance
        SELECT DISTINCT ON (i.queue, i.key) i.queue, i.key, i.fingerprint, i.id
        FROM input i
        WHERE i.key IS NOT NULL
        ORDER BY i.queue, i.key, i.ord
        ON CONFLICT (queue, key) DO NOTHING
        RETURNING job_id
    ),
    moved AS (
        INSERT INTO jobs AS j (id, queue, type, payload, priority, run_at, max_attempts,
                               lease_seconds, backoff_initial, backoff_max, backoff_multiplier,
                               expires_at, idempotency_key, group_key)
        SELECT i.id, i.queue, i.type, i.payload, i.priority,
               coalesce(i.run_at, evora_now() + make_interval(secs => coalesce(i.delay, 0))),
               i.max_attempts, i.lease_seconds, i.backoff_initial, i.backoff_max,
               i.backoff_multiplier, i.expires_at, i.key, i.group_key
        FROM input i
        WHERE i.key IS NULL OR i.id IN (SELECT k.job_id FROM keyed k)
        ORDER BY i.ord
        RETURNING j.*, j AS whole, evora_job_image(j) AS image
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
    -- ... then the others, by their key. A new statement, with a new snapshot: it sees the
    -- key of a racing submission that committed while the insert above waited for it. (An
    -- item whose key names its own id was created above.)
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
    WHERE x.key IS NOT NULL AND k.job_id IS DISTINCT FROM x.id;
END
$$;

-- Raises the validation error of one field: SQLSTATE 22023 (invalid_parameter_value), the
-- message starting with the field's path (`priority`, `jobs[3].backoff.multiplier`).
CREATE OR REPLACE FUNCTION evora.reject(field text, problem text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION '%: %', field, problem
        USING ERRCODE = 'invalid_parameter_value', COLUMN = field;
END
$$;

-- A timestamp field: an RFC 3339 string with an offset, whose instant is storable in UTC.
CREATE OR REPLACE FUNCTION evora.timestamp_field(value jsonb, field text) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
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
    -- the first and last instants a client library can hold do not round-trip
    IF parsed <= '0001-01-01 00:00:00+00' OR parsed >= '9999-12-31 23:59:59.999999+00' THEN
        PERFORM evora.reject(field, 'is out of range once converted to UTC');
    END IF;
    RETURN parsed;
END
$$;

-- A number field, between lo and hi (lo excluded when above_lo), optionally an integer.
CREATE OR REPLACE FUNCTION evora.number_field(
    value jsonb, field text, lo numeric, hi numeric, integral boolean,
    above_lo boolean DEFAULT false
) RETURNS numeric
LANGUAGE plpgsql STABLE AS $$
DECLARE
    n numeric;
BEGIN
    IF jsonb_typeof(value) <> 'number' OR (integral AND value::text !~ '^-?\d+$') THEN
        PERFORM evora.reject(field, CASE WHEN integral THEN 'must be an integer'
                                         ELSE 'must be a number' END);
    END IF;
    n := value::text::numeric;
    IF n > hi OR (CASE WHEN above_lo THEN n <= lo ELSE n < lo END) THEN
        PERFORM evora.reject(field, format('must be %s %s and at most %s',
            CASE WHEN above_lo THEN 'above' ELSE 'at least' END, lo, hi));
    END IF;
    RETURN n;
END
$$;

-- A name or key field: a string matching `pattern`, or of 1..max_length characters.
CREATE OR REPLACE FUNCTION evora.text_field(
    value jsonb, field text, pattern text, max_length integer, optional boolean
) RETURNS text
LANGUAGE plpgsql STABLE AS $$
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

-- One submission object (the body of POST /v1/jobs) checked field by field; `at` prefixes
-- each field's name in errors ('' or 'jobs[3].').
CREATE OR REPLACE FUNCTION evora.validated(item jsonb, at text) RETURNS evora.submission
LANGUAGE plpgsql STABLE AS $$
DECLARE
    lim CONSTANT jsonb := evora.limits();
    s evora.submission;
    field text;
    value jsonb;
    delay jsonb := 'null';
    backoff jsonb := '{}';
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
    FOR field, value IN SELECT * FROM jsonb_each(item) LOOP
        CASE field
        WHEN 'queue', 'type' THEN
            NULL;
        WHEN 'payload' THEN
            IF octet_length(value::text) > (lim ->> 'max_payload_bytes')::integer THEN
                PERFORM evora.reject(at || field, format(
                    'is %s bytes encoded; the limit is %s',
                    octet_length(value::text), lim ->> 'max_payload_bytes'));
            END IF;
            s.payload := value;
        WHEN 'priority' THEN
            s.priority := evora.number_field(value, at || field,
                (lim -> field ->> 'min')::numeric, (lim -> field ->> 'max')::numeric, true);
        WHEN 'max_attempts' THEN
            s.max_attempts := evora.number_field(value, at || field,
                (lim -> field ->> 'min')::numeric, (lim -> field ->> 'max')::numeric, true);
        WHEN 'lease_seconds' THEN
            s.lease_seconds := evora.number_field(value, at || field,
                (lim -> field ->> 'min')::numeric, (lim -> field ->> 'max')::numeric, true);
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
    RETURN s;
END
$$;

-- Validates every item (all or nothing), stores them and raises for the first item, in
-- order, whose idempotency key conflicts or whose job is gone. The ids, in item order.
CREATE OR REPLACE FUNCTION evora.submit_items(items jsonb, batch boolean) RETURNS uuid[]
LANGUAGE plpgsql AS $$
DECLARE
    subs evora.submission[];
    r record;
    at text;
    ids uuid[] := '{}';
BEGIN
    SELECT array_agg(evora.validated(e.item,
               CASE WHEN batch THEN format('jobs[%s].', e.n - 1) ELSE '' END) ORDER BY e.n)
    INTO subs
    FROM jsonb_array_elements(items) WITH ORDINALITY AS e(item, n);
    FOR r IN
        SELECT * FROM evora.submit_rows(
            ARRAY(SELECT evora.uuid7() FROM generate_series(1, cardinality(subs))),
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
            '{}', '{}')
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
        END IF;
        ids := ids || (r.job).id;
    END LOOP;
    RETURN ids;
END
$$;

-- Submits one job in the caller's transaction; its id (an idempotent replay: the id of the
-- job first submitted with that key). `options` holds the other fields of POST /v1/jobs.
CREATE OR REPLACE FUNCTION evora.submit(
    queue text, type text, payload jsonb DEFAULT '{}', options jsonb DEFAULT '{}'
) RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
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

-- Submits the jobs of a JSON array of submission objects (each shaped like the body of
-- POST /v1/jobs) in the caller's transaction, all or nothing; their ids in order.
CREATE OR REPLACE FUNCTION evora.submit_batch(jobs jsonb) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $$
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

-- The entry points run with the search_path fixed to the schema that holds Evora's tables
-- (the one this migration runs in), then pg_temp: never a caller's objects. The functions
-- they call run inside that setting (fixing it on each would cost a setting change per
-- field checked). Nothing in the schema is PUBLIC's.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY['evora.submit(text, text, jsonb, jsonb)',
                             'evora.submit_batch(jsonb)',
                             'evora.submit_rows(uuid[], text[], text[], jsonb[], smallint[], '
                             'timestamptz[], float8[], integer[], integer[], float8[], '
                             'float8[], float8[], timestamptz[], text[], text[], bytea[], '
                             'text[])'
                            ]::regprocedure[] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = 'evora'::regnamespace LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;

REVOKE ALL ON SCHEMA evora FROM PUBLIC;
GRANT USAGE ON SCHEMA evora TO evora_producer;
GRANT EXECUTE ON FUNCTION evora.submit(text, text, jsonb, jsonb) TO evora_producer;
GRANT EXECUTE ON FUNCTION evora.submit_batch(jsonb) TO evora_producer;

-- The retention function runs as its owner too; only Evora's own services call it.
REVOKE ALL ON FUNCTION evora_drop_archived_events(bigint, float8, integer) FROM PUBLIC;
