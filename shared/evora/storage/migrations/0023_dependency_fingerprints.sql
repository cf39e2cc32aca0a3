-- Evora schema, version 23: an idempotency key compares a submission's dependencies too.
--
-- Until now the fingerprint stored with a key left out `depends_on` and
-- `on_dependency_failure`, so the same key with other dependencies replayed the first job
-- instead of being refused as a conflict. Here they are part of it, folded in only for a
-- submission that has dependencies: a submission without them keeps the fingerprint of
-- version 14 (evora.submission_fingerprint(), unchanged), so the keys stored before still
-- replay it. (Without dependencies on_dependency_failure has no effect, and is not compared.)
-- A key stored before by a submission with dependencies has them missing from its
-- fingerprint: a retry of it is refused as a conflict, never replayed for other dependencies.
--
-- What a dependency counts as:
--   * a job named by id: that id. The dependencies are a set (the job waits for all of
--     them), so their order does not matter, and an id may not repeat;
--   * an earlier item of the same call (a batch's "ref:<name>"): that item, as its own
--     fingerprint (its fields and its own dependencies) and its idempotency key, not the id
--     it resolves to. The id changes when the batch is sent again: a keyed item then
--     replays the job stored the first time, an item without a key is made again; a keyed
--     item naming either one is still the same submission, and must replay. It also needs
--     no look-up in the database, so racing submissions compare what they were given.

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
    limit_key_ords integer[], limit_key_names text[]
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
                       x.expires_at, x.group_key, coalesce(l.names, '{}')) END AS plain,
               CASE WHEN d.deps IS NOT NULL
                    THEN '\x03'::bytea
                         || int4send(octet_length(convert_to(coalesce(x.on_failure, 'cancel'),
                                                             'UTF8')))
                         || convert_to(coalesce(x.on_failure, 'cancel'), 'UTF8')
                         || coalesce(d.jobs, ''::bytea) END AS head
        FROM unnest(queues, types, payloads, priorities, run_ats, delays, max_attempts, leases,
                    backoff_initials, backoff_maxes, backoff_multipliers, expires_ats,
                    idempotency_keys, group_keys, on_failures)
            WITH ORDINALITY AS x(queue, type, payload, priority, run_at, delay, max_attempts,
                                 lease_seconds, backoff_initial, backoff_max,
                                 backoff_multiplier, expires_at, key, group_key, on_failure, ord)
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

-- evora.store_submissions() of version 19, with the same signature and the same answers but
-- for the fingerprints, now computed by evora.submission_fingerprints().
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
BEGIN
    waited := dependency_ids;
    IF array_remove(idempotency_keys, NULL) <> '{}' THEN
        fingerprints := evora.submission_fingerprints(
            ids, queues, types, payloads, priorities, run_ats, delays, max_attempts, leases,
            backoff_initials, backoff_maxes, backoff_multipliers, expires_ats,
            idempotency_keys, group_keys, dependency_ords, dependency_ids, on_failures,
            limit_key_ords, limit_key_names);
        -- The keys first, before any dependency is counted: an item whose key replays a
        -- stored job is that job for the items naming it. A key repeated in this call is
        -- stored once, for its first appearance.
        WITH keyed AS (
            INSERT INTO idempotency_keys (queue, key, fingerprint, job_id)
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
            SELECT * FROM evora_hold_dependencies(ARRAY(
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
            DELETE FROM idempotency_keys k
            USING unnest(ids, queues, idempotency_keys, refusals) AS x(id, queue, key, refusal)
            WHERE x.refusal IS NOT NULL AND k.queue = x.queue AND k.key = x.key
              AND k.job_id = x.id;
        END IF;
    END IF;
    -- Created: an item neither refused nor answered by a key stored before (or by an
    -- earlier item of this call). Their positions in the order of their ids: the inserted
    -- rows, sorted by id too, are matched to them by rank.
    created := ARRAY(
        SELECT x.ord::integer
        FROM unnest(ids, idempotency_keys, refusals) WITH ORDINALITY AS x(id, key, refusal, ord)
        WHERE x.refusal IS NULL AND (x.key IS NULL OR x.id IN (SELECT unnest(kept)))
        ORDER BY x.id);
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
        INSERT INTO jobs AS j (id, queue, type, payload, priority, run_at, max_attempts,
                               lease_seconds, backoff_initial, backoff_max, backoff_multiplier,
                               expires_at, idempotency_key, group_key, state, dependencies_left,
                               on_dependency_failure, has_dependents, depends_on, limit_keys)
        SELECT x.id, x.queue, x.type, x.payload, x.priority,
               coalesce(x.run_at, evora_now() + make_interval(secs => coalesce(x.delay, 0))),
               x.max_attempts, x.lease_seconds, x.backoff_initial, x.backoff_max,
               x.backoff_multiplier, x.expires_at, x.key, x.group_key,
               CASE WHEN coalesce(lefts[x.ord], 0) > 0 THEN 'WAITING' ELSE 'PENDING' END::job_state,
               coalesce(lefts[x.ord], 0), coalesce(x.on_failure, 'cancel'),
               x.id IN (SELECT unnest(waited)), l.deps, coalesce(lk.names, '{}')
        FROM unnest(ids, queues, types, payloads, priorities, run_ats, delays, max_attempts,
                    leases, backoff_initials, backoff_maxes, backoff_multipliers, expires_ats,
                    idempotency_keys, group_keys, on_failures)
            WITH ORDINALITY AS x(id, queue, type, payload, priority, run_at, delay,
                                 max_attempts, lease_seconds, backoff_initial, backoff_max,
                                 backoff_multiplier, expires_at, key, group_key, on_failure, ord)
        LEFT JOIN lists l ON l.ord = x.ord
        LEFT JOIN evora.limit_key_lists(limit_key_ords, limit_key_names) lk ON lk.ord = x.ord
        WHERE x.ord IN (SELECT unnest(created))
        ORDER BY x.ord
        RETURNING j.*, j AS whole, evora_job_image(j) AS image
    ),
    edges AS (
        INSERT INTO job_dependencies (job_id, depends_on)
        SELECT m.id, d.dep
        FROM moved m
        CROSS JOIN LATERAL unnest(m.depends_on) AS d(dep)
        WHERE cardinality(waited) > 0  -- else not even a pass over the rows
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
    SELECT created[m.rank::integer], 'created'::text, NULL::integer, m.whole,
           (SELECT array_agg(h.q) FROM hinted h),
           (SELECT array_agg(c.q) FROM claimable c WHERE c.q = ANY(quiet))
    FROM (SELECT r.whole, row_number() OVER (ORDER BY r.id) AS rank FROM moved r) AS m;
    IF cardinality(created) = cardinality(ids) THEN
        RETURN;
    END IF;
    -- ... then the refused ones ...
    RETURN QUERY
    SELECT x.ord::integer, x.refusal, culprits[x.ord], NULL::jobs, NULL::text[], NULL::text[]
    FROM unnest(refusals) WITH ORDINALITY AS x(refusal, ord)
    WHERE x.refusal IS NOT NULL;
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
    LEFT JOIN idempotency_keys k ON k.queue = x.queue AND k.key = x.key
    LEFT JOIN jobs s ON s.id = k.job_id
    WHERE x.key IS NOT NULL AND k.job_id IS DISTINCT FROM x.id AND x.refusal IS NULL;
END
$$;

-- CREATE OR REPLACE resets the function's settings: Evora's own search_path again.
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

-- Nothing in the evora schema is PUBLIC's.
REVOKE ALL ON FUNCTION evora.submission_fingerprints(uuid[], text[], text[], jsonb[],
    smallint[], timestamptz[], float8[], integer[], integer[], float8[], float8[], float8[],
    timestamptz[], text[], text[], integer[], uuid[], text[], integer[], text[]) FROM PUBLIC;
