-- Submissions in SQL (docs/sql-enqueue.md): evora.submit() and evora.submit_batch(), which
-- an application may call on its own connection, the validation they share with the api, and
-- evora.store_submissions(), which every producer's submission goes through.
--
-- The current text of this area's functions and triggers: edit them here. `evora migrate`
-- runs the file again whole, so every statement is re-runnable (CONTRIBUTING.md says how).

-- A time-ordered UUID (RFC 9562 version 7), as the api makes for its jobs: consecutive ids
-- land on the same primary-key pages, and the admin listing's order, newest first, is the
-- ids' (migration 0068). The millisecond's fraction fills rand_a (12 bits, RFC 9562's third
-- method), so the ids of successive calls order as the calls did; the ids a statement makes
-- in one microsecond share it, and are sorted where their order is the items'
-- (evora.submit_items()). (uuidv7() is built in only from PostgreSQL 18.)
CREATE OR REPLACE FUNCTION evora.uuid7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(overlay(uuid_send(gen_random_uuid())
        PLACING int8send(((t.us / 1000) << 16) | 28672 | ((t.us % 1000) * 4096 / 1000))
        FROM 1 FOR 8), 'hex')::uuid
    FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8 AS us) AS t
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

-- `vals` for `items` items: an array of one element stands for that value for every item;
-- any other array is already one element per item (for one item the two are the same).
-- (OR REPLACE: the evora schema outlives the tables of a schema dropped and migrated again.)
CREATE OR REPLACE FUNCTION evora.for_each_item(vals anyarray, items integer) RETURNS anyarray
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN cardinality(vals) = 1 THEN array_fill(vals[1], ARRAY[items]) ELSE vals END
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

-- A number field, between lo and hi (lo excluded when above_lo), optionally an integer. An
-- integer field (priority, max_attempts, lease_seconds) takes any number whose value is
-- whole, however it is written (100, 1e2, 100.0, 1.0E2), as `POST /v1/jobs` does: jsonb
-- reads 1e2 as 100 but keeps the scale of 100.0, so the digits alone are not the rule.
CREATE OR REPLACE FUNCTION evora.number_field(
    value jsonb, field text, lo numeric, hi numeric, integral boolean,
    above_lo boolean DEFAULT false
) RETURNS numeric
LANGUAGE plpgsql STABLE AS $$
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

-- The bounds and defaults of a submission, its dependencies and the limit keys a job may
-- hold (named limits() before request bounds and flow-control limits had words of their
-- own). evora.protocol.bounds and the api's submission model hold the same numbers;
-- tests/sql_enqueue/test_bounds.py keeps them equal.
CREATE OR REPLACE FUNCTION evora.limits() RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
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
$$;

-- Client JSON (a payload, or a result evora.complete() stores) as `POST /v1/jobs` and the
-- dispatcher take it: at most max_payload_bytes encoded (PostgreSQL's text form), and no
-- number a double cannot hold (it rounds to infinity: from the midpoint between the largest
-- double and 2^1024 on), so every client can read what it gets. Returns `value`.
CREATE OR REPLACE FUNCTION evora.client_json(value jsonb, field text) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
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
$$;

-- A `limit_keys` field: a JSON array of distinct keys, each of the limit key alphabet
-- (an element's errors name it as `limit_keys.<index>`, as the api's model does).
CREATE OR REPLACE FUNCTION evora.limit_keys_field(value jsonb, field text) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
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

-- Every item's limit keys as one list, by position (from 1): `ords` and `names` flattened,
-- in the item's order.
CREATE OR REPLACE FUNCTION evora.limit_key_lists(ords integer[], names text[])
RETURNS TABLE (ord integer, names text[])
LANGUAGE sql IMMUTABLE AS $$
    SELECT u.ord, array_agg(u.name ORDER BY u.n)
    FROM unnest(ords, names) WITH ORDINALITY AS u(ord, name, n)
    GROUP BY u.ord
$$;

-- An object field (debounce, throttle) holding only the fields `known`, each required.
CREATE OR REPLACE FUNCTION evora.object_field(value jsonb, field text, known text[])
RETURNS void
LANGUAGE plpgsql STABLE AS $$
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
            -- the hard time limit of an attempt (docs/jobs-that-wait.md); null: none
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
    -- Debounce and throttle (docs/flow-control.md, "Debounce and throttle"), as the api's
    -- model checks them.
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

-- One submission object checked field by field: evora.validated() for its fields, then the
-- dependency fields. A "ref:" is resolved by evora.submit_items(), which
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
    -- An item a key may answer with an existing job has no job of its own to be named by, or
    -- to wait for others with.
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
$$;

-- Identity of a submission for idempotency: its fields with the limit keys appended when
-- there are any, then the time limit when there is one ('\x04' and its seconds: the bytes
-- before it are length-prefixed or escaped jsonb, which never holds that byte), so a
-- submission without them keeps the fingerprint stored before they existed.
-- (The payload's printed jsonb cannot hold a raw \x02: it escapes control characters.)
CREATE OR REPLACE FUNCTION evora.submission_fingerprint(
    queue text, type text, payload jsonb, priority smallint, run_at timestamptz,
    delay_seconds float8, max_attempts integer, lease_seconds integer, backoff_initial float8,
    backoff_max float8, backoff_multiplier float8, expires_at timestamptz, group_key text,
    limit_keys text[], max_duration integer DEFAULT NULL
) RETURNS bytea
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
        || convert_to(payload::text, 'UTF8')
        || CASE WHEN cardinality(limit_keys) = 0 THEN ''::bytea ELSE '\x02'::bytea || (
               SELECT string_agg(int4send(length(convert_to(k, 'UTF8'))) || convert_to(k, 'UTF8'),
                                 ''::bytea ORDER BY n)
               FROM unnest(limit_keys) WITH ORDINALITY AS u(k, n)) END
        || coalesce('\x04'::bytea || int4send(max_duration), ''::bytea))
$$;

-- By item, the fingerprint its idempotency key is stored and compared with (NULL for an item
-- without a key). Arguments as evora.store_submissions() takes them. Dependencies enter as
-- a section hashed after the fingerprint of the other fields:
--     sha256(fingerprint || '\x03' || length || on_dependency_failure || dependencies)
-- with the dependencies in byte order, each '\x01' || the id of a job, or '\x02' || the
-- fingerprint of an item of the call || '\x01' || length || its key ('\x00': no key). (So
-- the jobs come first, then the items.)
CREATE OR REPLACE FUNCTION evora.submission_fingerprints(
    ids uuid[], queues text[], types text[], payloads jsonb[], priorities smallint[],
    run_ats timestamptz[], delays float8[], max_attempts integer[], leases integer[],
    backoff_initials float8[], backoff_maxes float8[], backoff_multipliers float8[],
    expires_ats timestamptz[], idempotency_keys text[], group_keys text[],
    dependency_ords integer[], dependency_ids uuid[], on_failures text[],
    limit_key_ords integer[], limit_key_names text[], max_durations integer[] DEFAULT NULL
) RETURNS bytea[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    -- the positions (from 1) of the items another item of this call names
    named integer[] := '{}';
    -- by item: the fingerprint of each keyed or named item, NULL for the others
    prints bytea[];
    -- by item, for those that name items of this call: what they hash before those items
    heads bytea[];
    item record;
BEGIN
    IF cardinality(dependency_ids) > 0 THEN
        named := ARRAY(
            SELECT DISTINCT i.ord::integer
            FROM unnest(dependency_ids) AS e(dep)
            JOIN unnest(ids) WITH ORDINALITY AS i(id, ord) ON i.id = e.dep);
    END IF;
    -- Every fingerprint in one pass, except those of the items that name items of this
    -- call: they need the fingerprints of the items they name first.
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
    -- Then those, in the order of the items: an item names only earlier items, whose
    -- fingerprints are known by then. Naming one item is the common case (a chain, a
    -- fan-out); it is an expression PL/pgSQL evaluates without running a query, about ten
    -- times cheaper per item than the general case below it.
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
    -- Only keys are stored: not the fingerprints of the items named without one.
    RETURN ARRAY(
        SELECT CASE WHEN x.key IS NOT NULL THEN x.print END
        FROM unnest(idempotency_keys, prints) WITH ORDINALITY AS x(key, print, ord)
        ORDER BY x.ord);
END
$$;

-- Admission control (docs/flow-control.md, "Admission"): the items at positions `created`
-- (from 1; by item `queues`, and their limit keys flattened as store_submissions takes them)
-- are about to be stored; raises SQLSTATE EV429 (DETAIL: the key) if, for some key they hold
-- whose governing limit has a max_pending, the jobs holding it that wait to run (PENDING or
-- WAITING) would then be more than it allows. Nothing else is ever refused: a replay stores
-- nothing, and a retry or a redrive moves a job that was admitted already.
--
-- Exact under concurrent producers: each such key is locked (a transaction advisory lock,
-- class 'EVAD', on its hash, apart from the claim's 'EVOR') before it is counted, in a new
-- statement whose snapshot shows every admission of that key that committed before the lock
-- was granted; the lock is held to the end of the transaction, which stores the jobs. Locks
-- are taken in the order of the hashes whatever the call, so two calls cannot deadlock on
-- them. Under REPEATABLE READ or SERIALIZABLE the count would be the transaction's first
-- snapshot, which may miss an admission committed since (serializable checks do not see the
-- api's READ COMMITTED transactions): refused.
CREATE OR REPLACE FUNCTION evora.admit(queues text[], created integer[], limit_key_ords integer[],
                                       limit_key_names text[])
RETURNS void
LANGUAGE plpgsql AS $$
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
    -- A new statement, under the locks: every earlier admission of these keys is visible.
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

-- Debounce and throttle (docs/flow-control.md, "Debounce and throttle"): of the items at
-- the given positions (by item: `queues`, `payloads` and the keys with their seconds, NULL
-- keys for items without), those a key answers with a job instead of storing one, by position
-- (`item`, from 1), with `answer` 'debounced' or 'throttled' and the job (`by_job`: an
-- existing job, or the id of the item of this call that is stored for the key). For each key
-- (queue, kind, key), in the order of the items:
--   debounce  the PENDING job the key names that never started (the claim has not taken it)
--             absorbs them all: its payload becomes the last item's, its run_at now + the
--             last item's delay_seconds, never past its run_by (made + max_delay_seconds of
--             the submission that made it), event `debounced`. With no such job the last
--             item is stored (run_at now + its delay) and the key names it; the earlier items
--             of this call answer with it: the later submission wins.
--   throttle  an item within its window_seconds of when the job the key names was made (a
--             job that still exists, in any state) answers with that job; the first item that
--             is not is stored and the key names it from then on.
-- The items left out are stored as usual; their positions are kept by the caller.
--
-- Race-free under concurrent producers: each key is locked (a transaction advisory lock, class
-- 'EVDT', on the hash of queue, kind and key) and only then read, in a new statement whose
-- snapshot shows every submission of that key that committed before the lock was granted;
-- the lock is held to the end of the transaction, which stores the job the key names. Keys
-- are locked in the order of their hashes, whatever the call, so calls cannot deadlock on
-- them. A claim that took the absorbed job first wins: the UPDATE waits for its row lock and
-- finds the job started (its own row re-checked), so a new job is made. Under REPEATABLE READ
-- or SERIALIZABLE the read would be the transaction's first snapshot: refused, as evora.admit
-- refuses.
CREATE OR REPLACE FUNCTION evora.debounce_and_throttle(
    ids uuid[], queues text[], payloads jsonb[], debounce_keys text[], debounce_delays float8[],
    debounce_max_delays float8[], throttle_keys text[], throttle_windows float8[]
) RETURNS TABLE (item integer, answer text, by_job uuid)
LANGUAGE plpgsql AS $$
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
            -- Joined on the key's row, which only holders of the lock change; the job's own
            -- state is re-checked on its newest version if a claim locked it meanwhile.
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
            SET job_id = excluded.job_id, since = excluded.since, run_by = excluded.run_by;
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
                    -- `until`: when the sweeper may forget the key (migration 0056)
                    INSERT INTO evora.submission_keys AS k (queue, kind, key, job_id, since, until)
                    VALUES (g.queue, 'throttle', g.key, held_job, held_since,
                            held_since + make_interval(secs => throttle_windows[o]))
                    ON CONFLICT ON CONSTRAINT submission_keys_pkey DO UPDATE
                    SET job_id = excluded.job_id, since = excluded.since, until = excluded.until;
                END IF;
            END LOOP;
        END IF;
    END LOOP;
END
$$;

-- Stores submissions that are already valid, one array element each, in one statement,
-- and answers each by its position (ord, from 1), the created ones first:
--   created               a new job (its `submitted` event written, its queue hinted)
--   replayed              its idempotency key was stored before with the same fingerprint
--                         (evora.submission_fingerprints()): the stored job, in its current
--                         state
--   conflict              the key was stored before with another fingerprint
--   repeat_conflict       the key appears earlier in this call (at first_ord) with other
--                         fields
--   gone                  the key was stored before, but its job has since been removed
--   unknown_dependency    no such job (nor an item of this call), `first_ord` the position
--                         (from 1) of the offending dependency in the item's list
--   cancelled_dependency  it is CANCELLED and the item would be cancelled with it
--   debounced             its debounce key's job absorbed it (evora.debounce_and_throttle()):
--                         that job, updated, or the job of a later item of this call
--   throttled             its throttle key answered with the job made within its window
-- Keys are inserted in one order whatever the call, so racing calls cannot deadlock, and
-- ON CONFLICT waits for a racing holder of the same key to commit: of any racing
-- submissions exactly one creates the job. `quiet` are queues whose hint the caller sends
-- later itself (storage/notify.py); `notified` and `owed` say which were sent and held back.
-- `before_0011` are the fingerprints the api computed before SQL submissions existed (in
-- Python, from the request), for keys stored then: a retry of such a submission still
-- replays its job.
--
-- `dependency_ords` and `dependency_ids` are the items' edges (the item's position, from 1,
-- and the job it waits for, in the item's depends_on order; a job of this same call may be
-- named by its id), `on_failures` their on_dependency_failure (NULL: 'cancel'). An item
-- with unfinished dependencies is stored WAITING. Dependencies can only be existing jobs or
-- items of this call: a cycle cannot be written. `limit_key_ords` and `limit_key_names` are
-- the items' limit keys, flattened the same way. `debounce_keys` .. `throttle_windows` are
-- the items' debounce and throttle fields (NULL: none; such an item has no idempotency key,
-- dependency or ref).
--
-- The cost is linear in the number of items whatever plan PostgreSQL keeps. PL/pgSQL keeps
-- one generic plan from the sixth call of a session on, made without knowing how many items
-- the arrays hold (it guesses a handful), so nothing here may be quadratic in a plan built
-- on that guess:
--   * the positions of the items to create are decided before the insert, in the order of
--     their ids, and the inserted rows, ranked by id, are matched to them by rank: nothing
--     is joined on a guess (nor read back from the table, where a plan made while the table
--     was small would scan it);
--   * membership ("is this id one of the call's", "was this key stored by this call") is a
--     hashed `IN (SELECT unnest(...))`, one probe per row;
--   * every per-item array is read through one `unnest(...) WITH ORDINALITY` with the
--     others, never by subscript, except arrays of integers (a fixed-width element is found
--     directly);
--   * each item's dependency verdict is one aggregate over the edges, not a scan of all
--     edges per item.
CREATE OR REPLACE FUNCTION evora.store_submissions(
    ids uuid[], queues text[], types text[], payloads jsonb[], priorities smallint[],
    run_ats timestamptz[], delays float8[], max_attempts integer[], leases integer[],
    backoff_initials float8[], backoff_maxes float8[], backoff_multipliers float8[],
    expires_ats timestamptz[], idempotency_keys text[], group_keys text[],
    before_0011 bytea[], quiet text[], dependency_ords integer[], dependency_ids uuid[],
    on_failures text[], limit_key_ords integer[], limit_key_names text[],
    -- by item, each job's max_duration_seconds and fairness key, its debounce key with its
    -- delay and max delay, its throttle key with its window (NULL, or a NULL element: none);
    -- last and defaulted so the previous release's statement, without them, still resolves
    -- here
    max_durations integer[] DEFAULT NULL, fairness_keys text[] DEFAULT NULL,
    debounce_keys text[] DEFAULT '{}', debounce_delays float8[] DEFAULT '{}',
    debounce_max_delays float8[] DEFAULT '{}', throttle_keys text[] DEFAULT '{}',
    throttle_windows float8[] DEFAULT '{}'
) RETURNS TABLE (ord integer, outcome text, first_ord integer, job evora.jobs, notified text[],
                 owed text[])
-- `SET random_page_cost = 1` and `k.key = ANY(idempotency_keys)` beside the joins on the
-- keys, as on evora.claim_jobs() (the reason is there): a plan kept from a table of a few
-- keys read every stored key on each later keyed submission (1,009 rows to replay one
-- beside 1,000 stored, tests/integration/test_plan_traps.py).
LANGUAGE plpgsql SET random_page_cost = 1 AS $$
DECLARE
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
    -- the positions of the items this call creates, in the order of their ids
    created integer[];
    -- the items a debounce or throttle key answers with a job, how, and the job
    absorbed integer[] := '{}';
    answers text[];
    answering uuid[];
BEGIN
    waited := dependency_ids;
    -- Debounce and throttle keys first (docs/flow-control.md, "Debounce and throttle"): an
    -- absorbing job's row is locked under its key's lock, before this call waits for any
    -- other lock (an idempotency key's racing holder, a dependency's row), so every call
    -- takes its locks in one order: key locks, then rows and keys, then admission's.
    IF array_remove(debounce_keys, NULL) <> '{}' OR array_remove(throttle_keys, NULL) <> '{}' THEN
        SELECT coalesce(array_agg(a.item), '{}'), array_agg(a.answer), array_agg(a.by_job)
        INTO absorbed, answers, answering
        FROM evora.debounce_and_throttle(ids, queues, payloads, debounce_keys, debounce_delays,
                                         debounce_max_delays, throttle_keys, throttle_windows) a;
        -- a debounced job is stored to run after its delay
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
        -- The keys first, before any dependency is counted: an item whose key replays a
        -- stored job is that job for the items naming it. A key repeated in this call is
        -- stored once, for its first appearance.
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
        -- A new statement, with a new snapshot: it sees the key of a racing submission that
        -- committed while the insert above waited for it.
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
            -- a dependency named twice by one item counts once
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
                   -- the first refused dependency, in the item's order
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
        -- A refused item is not stored: neither is its key.
        IF kept IS NOT NULL AND array_remove(refusals, NULL) <> '{}' THEN
            DELETE FROM evora.idempotency_keys k
            USING unnest(ids, queues, idempotency_keys, refusals) AS x(id, queue, key, refusal)
            WHERE x.refusal IS NOT NULL AND k.queue = x.queue AND k.key = x.key
              AND k.job_id = x.id AND k.key = ANY(idempotency_keys);
        END IF;
    END IF;
    -- Created: an item neither refused nor answered by a key stored before (or by an
    -- earlier item of this call, or by a debounce or throttle key). Their positions in the order of their ids: the inserted
    -- rows, sorted by id too, are matched to them by rank.
    created := ARRAY(
        SELECT x.ord::integer
        FROM unnest(ids, idempotency_keys, refusals) WITH ORDINALITY AS x(id, key, refusal, ord)
        WHERE x.refusal IS NULL AND (x.key IS NULL OR x.id IN (SELECT unnest(kept)))
          AND x.ord NOT IN (SELECT unnest(absorbed))
        ORDER BY x.id);
    -- Refused whole when a key they hold would have more jobs waiting than its max_pending
    -- allows. Limits are rare: a call pays only this look at them while none has one.
    IF EXISTS (SELECT 1 FROM evora.flow_limits WHERE max_pending IS NOT NULL) THEN
        PERFORM evora.admit(queues, created, limit_key_ords, limit_key_names);
    END IF;
    -- Keyed jobs tell their queue's fair claim they have work (functions/fairness.sql): one
    -- ledger row per queue and key, appended without a lock.
    IF array_remove(fairness_keys, NULL) <> '{}' THEN
        PERFORM evora.fair_note(ARRAY(SELECT queues[c] FROM unnest(created) AS c),
                                ARRAY(SELECT fairness_keys[c] FROM unnest(created) AS c),
                                array_fill(0, ARRAY[cardinality(created)]),
                                array_fill(0::float8, ARRAY[cardinality(created)]));
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
    moved AS (
        INSERT INTO evora.jobs AS j (id, queue, type, payload, priority, run_at, max_attempts,
                               lease_seconds, backoff_initial, backoff_max, backoff_multiplier,
                               expires_at, idempotency_key, group_key, state, dependencies_left,
                               on_dependency_failure, has_dependents, depends_on, limit_keys,
                               max_duration_seconds, fairness_key)
        SELECT x.id, x.queue, x.type, x.payload, x.priority,
               coalesce(x.run_at, evora.clock_now() + make_interval(secs => coalesce(x.delay, 0))),
               -- a default stored as NULL (migration 0067: a row's bytes are paid again in
               -- the WAL of every transition)
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
    -- The job image has no room for a job's limit and fairness keys: its event's data carries
    -- them, where it has any, so the auditor knows which keys an attempt held (docs/audit.md)
    -- even after retention removed the job. A job a schedule submits names the schedule and
    -- the tick: the scheduler sets `evora.submitted_data` (a JSON object, transaction-local)
    -- before it submits, so the submission stays the one every producer uses; the setting is
    -- empty or absent everywhere else.
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
    -- One row per statement (evora.event_batches, migration 0064), the events in the order
    -- the jobs were inserted; its data NULL when every event's is {}.
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
    -- ... then the refused ones ...
    RETURN QUERY
    SELECT x.ord::integer, x.refusal, culprits[x.ord], NULL::evora.jobs, NULL::text[], NULL::text[]
    FROM unnest(refusals) WITH ORDINALITY AS x(refusal, ord)
    WHERE x.refusal IS NOT NULL;
    -- ... then those a debounce or throttle key answered, with the job as it is now ...
    RETURN QUERY
    SELECT a.item, a.answer, NULL::integer, s, NULL::text[], NULL::text[]
    FROM unnest(absorbed, answers, answering) AS a(item, answer, by_job)
    JOIN evora.jobs s ON s.id = a.by_job;
    -- ... then the others, by their key, stored before this call or by an earlier item of
    -- it. (An item whose key names its own id was created above.)
    RETURN QUERY
    SELECT x.ord::integer,
           CASE
               WHEN s.id IS NULL THEN 'gone'
               WHEN k.fingerprint IN (x.fingerprint, x.before) THEN 'replayed'
               WHEN k.job_id IN (SELECT unnest(ids)) THEN 'repeat_conflict'
               ELSE 'conflict'
           END,
           -- the earlier item of this call that stored the key (found only for those)
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

-- Validates every item (all or nothing), resolves each "ref:<name>" to the id of the earlier
-- item that carries that ref (only an earlier one: a batch cannot describe a cycle), stores
-- them through evora.store_submissions() and raises for the first item, in order, whose
-- idempotency key conflicts, whose job is gone or whose dependency names no job (or one
-- CANCELLED that would cancel it). The ids, in item order.
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
    -- sorted: the items' ids in their order, which the listing shows newest first
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

-- The entry points, and the store they share, run with the search_path fixed to `evora`,
-- then pg_temp: every name in them is qualified already, so this is the guard of a SECURITY
-- DEFINER function, not how it finds Evora's objects (an operator or a function a caller
-- made in a schema of theirs, or in pg_temp, never stands in for one of PostgreSQL's). CREATE OR REPLACE resets a function's settings, so this follows every definition
-- above. The functions they call run inside that setting (fixing it on each would cost a
-- setting change per field checked). Nothing in the evora schema is PUBLIC's.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOREACH f IN ARRAY ARRAY['evora.submit(text, text, jsonb, jsonb)',
                             'evora.submit_batch(jsonb)',
                             'evora.store_submissions(uuid[], text[], text[], jsonb[], '
                             'smallint[], timestamptz[], float8[], integer[], integer[], '
                             'float8[], float8[], float8[], timestamptz[], text[], text[], '
                             'bytea[], text[], integer[], uuid[], text[], integer[], text[], '
                             'integer[], text[], text[], float8[], float8[], text[], float8[])'
                            ]::regprocedure[] LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = evora, pg_temp', f);
    END LOOP;
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = 'evora'::regnamespace LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
