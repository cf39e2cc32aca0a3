-- Evora schema, version 19: evora.store_submissions() of version 14, with the same signature
-- and the same answers, at a cost linear in the number of items whatever plan PostgreSQL
-- keeps for it.
--
-- PL/pgSQL plans the statements of a function for the values of its first calls, then
-- (from the sixth call of a session on) keeps one generic plan, made without knowing how
-- many items the arrays hold: it guesses a handful. Version 14 numbered the created jobs by
-- joining the inserted rows back to the items on their id; in the generic plan that join is
-- a nested loop, one comparison per pair of items, a million for a batch of 1,000: three
-- quarters of PostgreSQL's time in a batch submit. Likewise `x = ANY(array)` compares with
-- every element, and `array[i]` of an array of text or bytea walks the array from its start.
-- So here:
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
