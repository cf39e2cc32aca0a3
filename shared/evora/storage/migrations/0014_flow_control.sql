-- Evora schema, version 14: concurrency and rate limits per key, enforced by the claim
-- (docs/flow-control.md).
--
-- flow_limits holds the limits by key; a key ending in `*` is a prefix limit, which governs
-- every key starting with its stem that has no limit of its own, each such key separately.
-- A job holds `queue:<its queue>` and its `limit_keys`.
--
-- What RUNNING jobs hold a key is never stored: it is counted from the RUNNING rows, through
-- jobs_running_limit_keys (and the (queue, state) index for `queue:<q>`), so every way a job
-- leaves RUNNING frees its slot and nothing can drift. flow_buckets holds one row per key a
-- claim has used under a limit: its token bucket, and the lock that serialises the claims of
-- that key. A claim locks the rows of the keys it needs, then counts in a new snapshot, in
-- which every earlier claim of those keys is visible and no other one can be in flight.

CREATE TABLE flow_limits (
    key              text PRIMARY KEY,
    concurrency      integer CONSTRAINT flow_limits_concurrency CHECK (concurrency >= 1),
    rate_limit       integer CONSTRAINT flow_limits_rate_limit CHECK (rate_limit >= 1),
    rate_per_seconds float8
        CONSTRAINT flow_limits_rate_per_seconds CHECK (rate_per_seconds > 0),
    -- a prefix limit's stem (its key without the `*`); NULL for a limit of one key
    stem             text GENERATED ALWAYS AS (
        CASE WHEN right(key, 1) = '*' THEN left(key, -1) END) STORED,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT flow_limits_rate_whole CHECK ((rate_limit IS NULL) = (rate_per_seconds IS NULL))
);

-- The prefix limits, few: scanned whole for every key without a limit of its own.
CREATE INDEX flow_limits_prefixes ON flow_limits (stem) WHERE stem IS NOT NULL;

CREATE TABLE flow_buckets (
    key         text PRIMARY KEY,
    tokens      float8 NOT NULL,
    refilled_at timestamptz NOT NULL
);

-- Constant defaults: added without rewriting the table.
ALTER TABLE jobs
    ADD COLUMN limit_keys text[] NOT NULL DEFAULT '{}',
    -- set by the claim: a limit applied to the job, so leaving RUNNING frees room someone
    -- may wait for (the statements that end an attempt send the queue's hint)
    ADD COLUMN limited boolean NOT NULL DEFAULT false;

-- The RUNNING jobs holding a key; jobs without keys are not in it.
CREATE INDEX jobs_running_limit_keys ON jobs USING gin (limit_keys)
    WHERE state = 'RUNNING' AND limit_keys <> '{}';

-- The limit that governs each of `keys`: its own, else the longest prefix limit whose stem
-- it starts with. Keys no limit governs are left out.
CREATE FUNCTION evora_governing_limits(keys text[])
RETURNS TABLE (key text, concurrency integer, rate_limit integer, rate_per_seconds float8)
LANGUAGE sql STABLE AS $$
    SELECT DISTINCT ON (k.key) k.key, l.concurrency, l.rate_limit, l.rate_per_seconds
    FROM unnest(keys) AS k(key)
    CROSS JOIN LATERAL (
        SELECT e.concurrency, e.rate_limit, e.rate_per_seconds, -1 AS rank
        FROM flow_limits e WHERE e.key = k.key
        UNION ALL
        SELECT p.concurrency, p.rate_limit, p.rate_per_seconds, length(p.stem)
        FROM flow_limits p WHERE p.stem IS NOT NULL AND starts_with(k.key, p.stem)
    ) AS l
    ORDER BY k.key, l.rank = -1 DESC, l.rank DESC
$$;

-- How many RUNNING jobs hold `k`, by this statement's snapshot.
CREATE FUNCTION evora_running_holding(k text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM jobs r
            WHERE starts_with(k, 'queue:') AND r.state = 'RUNNING' AND r.queue = substr(k, 7))
         + (SELECT count(*) FROM jobs r
            WHERE r.state = 'RUNNING' AND r.limit_keys <> '{}' AND r.limit_keys @> ARRAY[k]
              AND NOT (starts_with(k, 'queue:') AND r.queue = substr(k, 7)))
$$;

-- A bucket's tokens at `at`: refilled at limit / per_seconds a second, capped at limit.
CREATE FUNCTION evora_tokens(b flow_buckets, rate_limit integer, rate_per_seconds float8,
                             at timestamptz)
RETURNS float8
LANGUAGE sql IMMUTABLE AS $$
    SELECT least(rate_limit::float8, b.tokens + greatest(0, extract(epoch FROM at - b.refilled_at))
                                                * rate_limit / rate_per_seconds)
$$;

CREATE TYPE evora_claim_candidate AS (
    id         uuid,
    priority   smallint,
    run_at     timestamptz,
    submit_seq bigint,
    -- every key the job holds (its queue's and its limit_keys), once each
    keys       text[],
    -- the round-robin lane: the first limit key ('' without keys)
    lane       text
);

-- The candidate selection of the claim while any limit exists (docs/flow-control.md): up to
-- `wanted` jobs of `queues` (of `types`, NULL: any), locked FOR UPDATE, each with whether a
-- limit applied to it. Works in rounds over windows of the queues' claimable jobs; a key
-- whose bucket row another claimer holds, or that has no room left, is blocked for the rest
-- of the claim and its jobs are skipped (no head-of-line blocking). Within one priority the
-- jobs are taken round-robin over their lanes.
--
-- ROWS 1: the claim joins what this returns to jobs by id; estimated at the default 1000
-- rows, the planner hashes the whole jobs table for that join even when the function is
-- never called (no limit defined), which doubled the claim's time.
CREATE FUNCTION evora_claim_limited(queues text[], types text[], wanted integer)
RETURNS TABLE (id uuid, limited boolean)
LANGUAGE plpgsql ROWS 1 AS $$
DECLARE
    at CONSTANT timestamptz := evora_now();
    taken uuid[] := '{}';
    taken_limited boolean[] := '{}';
    -- the keys of the jobs taken, once per job holding them: still PENDING in the snapshots
    -- of later rounds, so not counted as RUNNING there
    held text[] := '{}';
    seen uuid[] := '{}';
    blocked text[] := '{}';
    cands evora_claim_candidate[];
    window_size integer;
    need integer;
    lim_keys text[];
    lim_conc integer[];
    lim_rate integer[];
    lim_per float8[];
    locked text[];
    tried uuid[];
    try_keys text[];
    cap_keys text[];
    cap_vals bigint[];
    new_ids uuid[];
    new_flags boolean[];
    new_held text[];
BEGIN
    FOR round IN 1..4 LOOP
        need := wanted - cardinality(taken);
        EXIT WHEN need <= 0;
        window_size := 4 * need + 16;
        cands := ARRAY(
            SELECT ROW(c.id, c.priority, c.run_at, c.submit_seq,
                       ARRAY(SELECT DISTINCT x
                             FROM unnest(('queue:' || q.queue) || c.limit_keys) AS x),
                       coalesce(c.limit_keys[1], ''))::evora_claim_candidate
            FROM unnest(queues) AS q(queue)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, j.submit_seq, j.limit_keys
                FROM jobs j
                WHERE j.state = 'PENDING' AND j.queue = q.queue AND j.run_at <= at
                  AND (j.expires_at IS NULL OR j.expires_at > at OR j.started_at IS NOT NULL)
                  AND (types IS NULL OR j.type = ANY(types))
                  AND (j.group_key IS NULL OR (
                        NOT EXISTS (
                            SELECT 1 FROM jobs r
                            WHERE r.state = 'RUNNING' AND r.queue = j.queue
                              AND r.group_key = j.group_key)
                        AND NOT EXISTS (
                            SELECT 1 FROM jobs e
                            WHERE e.state = 'PENDING' AND e.queue = j.queue
                              AND e.group_key = j.group_key
                              AND (e.priority, e.submit_seq) < (j.priority, j.submit_seq))))
                  AND j.id <> ALL(seen)
                  AND NOT (j.limit_keys && blocked)
                ORDER BY j.priority, j.run_at, j.submit_seq
                LIMIT window_size
                -- The window is locked, as the unlimited claim locks its jobs: concurrent
                -- claimers then read different windows (and try different keys) instead of
                -- all contending for the head of the queue. Rows left unclaimed are free
                -- again when the claim commits.
                FOR UPDATE OF j SKIP LOCKED
            ) AS c
            WHERE NOT EXISTS (SELECT 1 FROM paused_queues p WHERE p.queue = q.queue)
              AND ('queue:' || q.queue) <> ALL(blocked));
        EXIT WHEN cardinality(cands) = 0;

        SELECT coalesce(array_agg(g.key ORDER BY g.key), '{}'),
               array_agg(g.concurrency ORDER BY g.key), array_agg(g.rate_limit ORDER BY g.key),
               array_agg(g.rate_per_seconds ORDER BY g.key)
        INTO lim_keys, lim_conc, lim_rate, lim_per
        FROM evora_governing_limits(
            ARRAY(SELECT DISTINCT k FROM unnest(cands) AS c, unnest(c.keys) AS k)) AS g;
        -- This round tries the first `need` candidates in round-robin order, and locks only
        -- their keys: the rest of the window only decides the turns, and stays for the next
        -- round (locking every key of the window made concurrent claimers skip each other's
        -- keys wholesale).
        tried := ARRAY(
            SELECT c.id
            FROM (SELECT c.*, row_number() OVER (PARTITION BY c.lane
                                                 ORDER BY c.priority, c.run_at, c.submit_seq)
                                  AS turn
                  FROM unnest(cands) AS c) AS c
            ORDER BY c.priority, c.turn, c.run_at, c.submit_seq
            LIMIT need);
        seen := seen || tried;
        try_keys := ARRAY(SELECT DISTINCT k FROM unnest(cands) AS c, unnest(c.keys) AS k
                          WHERE c.id = ANY(tried) AND k = ANY(lim_keys) ORDER BY k);

        cap_keys := '{}';
        cap_vals := '{}';
        IF cardinality(try_keys) > 0 THEN
            -- a new bucket starts full
            INSERT INTO flow_buckets (key, tokens, refilled_at)
            SELECT u.k, coalesce(u.r, 0), at
            FROM unnest(lim_keys, lim_rate) AS u(k, r)
            WHERE u.k = ANY(try_keys)
            ORDER BY u.k
            ON CONFLICT (key) DO NOTHING;
            locked := ARRAY(SELECT b.key FROM flow_buckets b WHERE b.key = ANY(try_keys)
                            ORDER BY b.key FOR UPDATE SKIP LOCKED);
            blocked := blocked || ARRAY(SELECT k FROM unnest(try_keys) AS k WHERE k <> ALL(locked));
            -- A new statement, so a new snapshot: every claim of the locked keys that
            -- committed before their locks were granted is counted. RUNNING jobs holding
            -- them are counted in one pass (a job holding `queue:<q>` in its limit_keys
            -- too counts once).
            WITH running AS (
                SELECT k AS key, count(*) AS n
                FROM jobs r, unnest(r.limit_keys) AS k
                WHERE r.state = 'RUNNING' AND r.limit_keys <> '{}' AND r.limit_keys && locked
                  AND k = ANY(locked) AND k <> 'queue:' || r.queue
                GROUP BY k
                UNION ALL
                SELECT 'queue:' || r.queue, count(*)
                FROM jobs r
                WHERE r.state = 'RUNNING' AND r.queue = ANY(
                    ARRAY(SELECT substr(k, 7) FROM unnest(locked) AS k
                          WHERE starts_with(k, 'queue:')))
                GROUP BY r.queue
            )
            SELECT coalesce(array_agg(g.k), '{}'), coalesce(array_agg(g.cap), '{}')
            INTO cap_keys, cap_vals
            FROM (
                SELECT u.k, least(
                    u.conc - coalesce(r.n, 0)
                        - (SELECT count(*) FROM unnest(held) AS h WHERE h = u.k),
                    floor(evora_tokens(b, u.rate, u.per, at))::bigint) AS cap
                FROM unnest(lim_keys, lim_conc, lim_rate, lim_per) AS u(k, conc, rate, per)
                JOIN flow_buckets b ON b.key = u.k
                -- joined, not a subquery per key: that would run the count once per key
                LEFT JOIN (SELECT key, sum(n) AS n FROM running GROUP BY key) AS r
                    ON r.key = u.k
                WHERE u.k = ANY(locked)
            ) AS g;
        END IF;

        WITH c AS (SELECT * FROM unnest(cands) AS c WHERE c.id = ANY(tried)),
        caps AS (SELECT * FROM unnest(cap_keys, cap_vals) AS x(key, cap)),
        -- each candidate's place in the line of every limited key it holds
        ranked AS (
            SELECT c.id, k.key,
                   row_number() OVER (PARTITION BY k.key
                                      ORDER BY c.priority, c.run_at, c.submit_seq) AS place
            FROM c CROSS JOIN LATERAL unnest(c.keys) AS k(key)
            WHERE k.key = ANY(cap_keys)
        ),
        admitted AS (
            SELECT c.id, c.priority, c.run_at, c.submit_seq,
                   c.keys && lim_keys AS is_limited,
                   row_number() OVER (PARTITION BY c.lane
                                      ORDER BY c.priority, c.run_at, c.submit_seq) AS turn
            FROM c
            WHERE NOT (c.keys && blocked)
              AND NOT EXISTS (
                  SELECT 1 FROM ranked r JOIN caps x ON x.key = r.key
                  WHERE r.id = c.id AND x.cap IS NOT NULL AND r.place > x.cap)
        ),
        chosen AS (
            SELECT a.id, a.is_limited FROM admitted a
            ORDER BY a.priority, a.turn, a.run_at, a.submit_seq
            LIMIT need
        ),
        got AS (
            -- by primary key: an IN (subquery) here was planned as a scan of jobs
            SELECT j.id FROM jobs j
            WHERE j.id = ANY(ARRAY(SELECT ch.id FROM chosen ch)) AND j.state = 'PENDING'
            FOR UPDATE OF j SKIP LOCKED
        )
        SELECT coalesce(array_agg(ch.id), '{}'), coalesce(array_agg(ch.is_limited), '{}')
        INTO new_ids, new_flags
        FROM chosen ch JOIN got g ON g.id = ch.id;

        new_held := ARRAY(SELECT k FROM unnest(cands) AS c, unnest(c.keys) AS k
                          WHERE c.id = ANY(new_ids) AND k = ANY(cap_keys));
        taken := taken || new_ids;
        taken_limited := taken_limited || new_flags;
        held := held || new_held;

        -- the tokens taken; keys left without room are blocked for the next rounds
        UPDATE flow_buckets b
        SET tokens = evora_tokens(b, u.rate, u.per, at) - n.used, refilled_at = at
        FROM unnest(lim_keys, lim_rate, lim_per) AS u(k, rate, per)
        JOIN (SELECT h AS k, count(*) AS used FROM unnest(new_held) AS h GROUP BY h) AS n
            ON n.k = u.k
        WHERE b.key = u.k AND u.rate IS NOT NULL;
        blocked := blocked || ARRAY(
            SELECT x.key FROM unnest(cap_keys, cap_vals) AS x(key, cap)
            WHERE x.cap - (SELECT count(*) FROM unnest(new_held) AS h WHERE h = x.key) <= 0);

        -- no window came back full and every candidate was tried: nothing more to find
        EXIT WHEN cardinality(cands) < window_size AND cardinality(cands) = cardinality(tried);
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(taken, taken_limited);
END
$$;

-- The limits of version 13, with the limit keys a job may hold; evora.protocol.limits holds
-- the same numbers (tests/sql/test_limits.py keeps them equal).
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
        "ref_pattern": "^[A-Za-z0-9_.:-]{1,255}$"
    }'::jsonb
$$;

-- What is in the evora schema is written to be re-runnable, as in version 11: every statement
-- replaces or is guarded.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute
                   WHERE attrelid = 'evora.submission'::regclass AND attname = 'limit_keys') THEN
        ALTER TYPE evora.submission ADD ATTRIBUTE limit_keys text[];
    END IF;
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

-- Identity of a submission for idempotency: evora.fingerprint() of version 11 with the limit
-- keys appended when there are any, so a submission without them keeps the fingerprint
-- stored before. (The payload's printed jsonb cannot hold a raw \x02: it escapes control
-- characters.) A name of its own, as evora.store_submissions() has: 0011 run again re-creates
-- evora.fingerprint(), which must not then stand beside an overload.
DROP FUNCTION IF EXISTS evora.fingerprint(text, text, jsonb, smallint, timestamptz, float8,
                                          integer, integer, float8, float8, float8,
                                          timestamptz, text);
CREATE OR REPLACE FUNCTION evora.submission_fingerprint(
    queue text, type text, payload jsonb, priority smallint, run_at timestamptz,
    delay_seconds float8, max_attempts integer, lease_seconds integer, backoff_initial float8,
    backoff_max float8, backoff_multiplier float8, expires_at timestamptz, group_key text,
    limit_keys text[]
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
               FROM unnest(limit_keys) WITH ORDINALITY AS u(k, n)) END)
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

-- evora.store_submissions() of version 13, with each item's limit keys: `limit_key_ords` and
-- `limit_key_names` flattened (the item's position, from 1, and the key, in the item's
-- order). The version before, without them, is dropped: one function, one signature.
DROP FUNCTION IF EXISTS evora.store_submissions(uuid[], text[], text[], jsonb[], smallint[],
                                                timestamptz[], float8[], integer[], integer[],
                                                float8[], float8[], float8[], timestamptz[],
                                                text[], text[], bytea[], text[], integer[],
                                                uuid[], text[]);

CREATE OR REPLACE FUNCTION evora.store_submissions(
    ids uuid[], queues text[], types text[], payloads jsonb[], priorities smallint[],
    run_ats timestamptz[], delays float8[], max_attempts integer[], leases integer[],
    backoff_initials float8[], backoff_maxes float8[], backoff_multipliers float8[],
    expires_ats timestamptz[], idempotency_keys text[], group_keys text[],
    before_0011 bytea[], quiet text[], dependency_ords integer[], dependency_ids uuid[],
    on_failures text[], limit_key_ords integer[], limit_key_names text[]
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
            SELECT CASE WHEN x.key IS NOT NULL THEN evora.submission_fingerprint(
                       x.queue, x.type, x.payload, x.priority, x.run_at, x.delay, x.max_attempts,
                       x.lease_seconds, x.backoff_initial, x.backoff_max, x.backoff_multiplier,
                       x.expires_at, x.group_key, coalesce(l.names, '{}')) END
            FROM unnest(queues, types, payloads, priorities, run_ats, delays, max_attempts, leases,
                        backoff_initials, backoff_maxes, backoff_multipliers, expires_ats,
                        idempotency_keys, group_keys)
                WITH ORDINALITY AS x(queue, type, payload, priority, run_at, delay, max_attempts,
                                     lease_seconds, backoff_initial, backoff_max,
                                     backoff_multiplier, expires_at, key, group_key, ord)
            LEFT JOIN evora.limit_key_lists(limit_key_ords, limit_key_names) l ON l.ord = x.ord
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
        SELECT x.*, coalesce(lefts[x.ord], 0) AS waiting_on, l.deps,
               coalesce(lk.names, '{}') AS limit_keys
        FROM unnest(ids, queues, types, payloads, priorities, run_ats, delays, max_attempts,
                    leases, backoff_initials, backoff_maxes, backoff_multipliers,
                    expires_ats, idempotency_keys, group_keys)
            WITH ORDINALITY AS x(id, queue, type, payload, priority, run_at, delay,
                                 max_attempts, lease_seconds, backoff_initial, backoff_max,
                                 backoff_multiplier, expires_at, key, group_key, ord)
        LEFT JOIN lists l ON l.ord = x.ord
        LEFT JOIN evora.limit_key_lists(limit_key_ords, limit_key_names) lk ON lk.ord = x.ord
        WHERE refusals[x.ord] IS NULL
    ),
    moved AS (
        INSERT INTO jobs AS j (id, queue, type, payload, priority, run_at, max_attempts,
                               lease_seconds, backoff_initial, backoff_max, backoff_multiplier,
                               expires_at, idempotency_key, group_key, state, dependencies_left,
                               on_dependency_failure, has_dependents, depends_on, limit_keys)
        SELECT i.id, i.queue, i.type, i.payload, i.priority,
               coalesce(i.run_at, evora_now() + make_interval(secs => coalesce(i.delay, 0))),
               i.max_attempts, i.lease_seconds, i.backoff_initial, i.backoff_max,
               i.backoff_multiplier, i.expires_at, i.key, i.group_key,
               CASE WHEN i.waiting_on > 0 THEN 'WAITING' ELSE 'PENDING' END::job_state,
               i.waiting_on, coalesce(on_failures[i.ord], 'cancel'), i.id = ANY(waited),
               i.deps, i.limit_keys
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
        'timestamptz[], text[], text[], bytea[], text[], integer[], uuid[], text[], integer[], '
        'text[]) '
        'SET search_path = %I, pg_temp', current_schema());
END
$$;
REVOKE ALL ON FUNCTION evora.store_submissions(uuid[], text[], text[], jsonb[], smallint[],
    timestamptz[], float8[], integer[], integer[], float8[], float8[], float8[], timestamptz[],
    text[], text[], bytea[], text[], integer[], uuid[], text[], integer[], text[]) FROM PUBLIC;

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
    s.limit_keys := '{}';
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
        WHEN 'limit_keys' THEN
            s.limit_keys := evora.limit_keys_field(value, at || field);
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

-- evora.submit_items() of version 13, passing each item's limit keys: validates every item
-- (all or nothing), resolves each "ref:<name>" to the id of the earlier item that carries
-- that ref, stores them through evora.store_submissions() and raises for the first item, in
-- order, whose idempotency key conflicts, whose job is gone or whose dependency names no
-- job (or one CANCELLED that would cancel it). The ids, in item order.
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
            ARRAY(SELECT (s).on_dependency_failure FROM unnest(subs) s),
            ARRAY(SELECT i FROM generate_series(1, cardinality(subs)) AS i,
                                unnest((subs[i]).limit_keys) WITH ORDINALITY AS k(name, place)
                  ORDER BY i, k.place),
            ARRAY(SELECT k.name FROM generate_series(1, cardinality(subs)) AS i,
                                     unnest((subs[i]).limit_keys) WITH ORDINALITY AS k(name, place)
                  ORDER BY i, k.place))
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

-- Nothing in the evora schema is PUBLIC's.
REVOKE ALL ON FUNCTION evora.limit_keys_field(jsonb, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION evora.limit_key_lists(integer[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION evora.submission_fingerprint(text, text, jsonb, smallint, timestamptz,
    float8, integer, integer, float8, float8, float8, timestamptz, text, text[]) FROM PUBLIC;
