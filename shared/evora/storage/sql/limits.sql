-- Concurrency and rate limits (docs/flow-control.md): defining them, and their live usage.
-- Enforcing them is the claim's (evora.claim_limited(), functions/claims_and_transitions.sql).

-- name: put_limit
-- $1 key, $2 concurrency, $3 rate limit, $4 rate period in seconds, $5 max_pending. The limit,
-- and whether it is new.
INSERT INTO evora.flow_limits AS l (key, concurrency, rate_limit, rate_per_seconds, max_pending)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (key) DO UPDATE
SET concurrency = excluded.concurrency, rate_limit = excluded.rate_limit,
    rate_per_seconds = excluded.rate_per_seconds, max_pending = excluded.max_pending,
    updated_at = now()
RETURNING l.key, l.concurrency, l.rate_limit, l.rate_per_seconds, l.max_pending, l.created_at,
          l.updated_at, (xmax = 0) AS created;

-- name: delete_limit
-- $1 key. Its buckets go with it (for a prefix limit, those of the keys under its stem
-- without a limit of their own); the key, if it was deleted.
WITH gone AS (
    DELETE FROM evora.flow_limits WHERE key = $1 RETURNING key, stem
),
buckets AS (
    DELETE FROM evora.flow_buckets b
    USING gone g
    WHERE b.key = g.key
       OR (g.stem IS NOT NULL AND starts_with(b.key, g.stem)
           AND NOT EXISTS (SELECT 1 FROM evora.flow_limits o WHERE o.key = b.key))
)
SELECT key FROM gone;

-- name: list_limits
-- $1 key to continue after (NULL: from the start), $2 page size.
SELECT key, concurrency, rate_limit, rate_per_seconds, max_pending, created_at, updated_at
FROM evora.flow_limits
WHERE $1::text IS NULL OR key > $1
ORDER BY key
LIMIT $2;

-- name: governing_limit
-- $1 key: the limit that governs it (its own, else the longest prefix limit whose stem it
-- starts with), with that limit's own key; no row when none does.
SELECT l.key, l.concurrency, l.rate_limit, l.rate_per_seconds, l.max_pending, l.created_at,
       l.updated_at
FROM evora.flow_limits l
WHERE l.key = $1 OR (l.stem IS NOT NULL AND starts_with($1, l.stem))
ORDER BY l.key = $1 DESC, length(l.stem) DESC
LIMIT 1;

-- name: key_usage
-- $1 key, $2 concurrency, $3 rate limit, $4 rate period, $5 at most this many held back
-- counted: RUNNING jobs holding the key, tokens in its bucket now (NULL without a rate; a key
-- never claimed has a full bucket), until when an upstream throttles it (NULL: not now;
-- evora.drain_buckets()), and the due PENDING jobs holding it while it has no room left, with
-- when the longest held back of those counted became due. Bounded in the backlog: the held
-- back are counted up to $5 (a count of $5 means at least), those of `queue:<q>` through
-- jobs_claimable a priority at a time, those that name the key among their limit_keys
-- through jobs_waiting_limit_keys (tests/integration/test_generic_plans.py).
SELECT r.running, t.tokens, t.throttled_until, coalesce(h.jobs, 0)::bigint AS throttled_jobs,
       h.since AS throttled_since
FROM (SELECT evora.running_holding($1) AS running) AS r
CROSS JOIN LATERAL (
    SELECT CASE WHEN $3::int4 IS NOT NULL THEN coalesce(
               (SELECT evora.tokens(b, $3::int4, $4::float8, evora.clock_now())
                FROM evora.flow_buckets b WHERE b.key = $1), $3::int4) END AS tokens,
           (SELECT b.throttled_until FROM evora.flow_buckets b
            WHERE b.key = $1 AND b.throttled_until > evora.clock_now()) AS throttled_until
) AS t
LEFT JOIN LATERAL (
    SELECT count(*) AS jobs, min(c.run_at) AS since FROM (
        -- a job counts once, even of the queue and naming `queue:<its queue>` too
        SELECT q.id, q.run_at FROM (
            SELECT s.id, s.run_at
            FROM evora.pending_priorities(
                CASE WHEN starts_with($1, 'queue:') THEN ARRAY[substr($1, 7)] ELSE '{}' END) AS p
            CROSS JOIN LATERAL (
                SELECT j.id, j.run_at FROM evora.jobs j
                WHERE j.state = 'PENDING' AND j.queue = p.queue AND j.priority = p.priority
                  AND j.run_at <= evora.clock_now()
                ORDER BY j.run_at
                LIMIT $5
            ) AS s
            LIMIT $5
        ) AS q
        UNION
        SELECT k.id, k.run_at FROM (
            SELECT j.id, j.run_at FROM evora.jobs j
            WHERE j.state = 'PENDING' AND j.limit_keys <> '{}' AND j.limit_keys @> ARRAY[$1::text]
              AND j.run_at <= evora.clock_now()
            LIMIT $5
        ) AS k
        LIMIT $5
    ) AS c
) AS h ON r.running >= $2::int4 OR t.tokens < 1 OR t.throttled_until IS NOT NULL;

-- name: key_depth
-- $1 a concrete key: how many jobs holding it wait to run (PENDING or WAITING), all counted.
SELECT evora.pending_holding($1, NULL);

-- name: prefix_usage
-- $1 stem of a prefix limit, $2 its concurrency, $3 rate limit, $4 rate period. Summed over
-- the keys it governs (those starting with the stem that have no limit of their own and no
-- longer prefix limit) that live jobs hold: RUNNING jobs holding them, and due PENDING jobs
-- holding one without room left (an upstream's drain included), with when the longest held
-- back became due. Reads the live jobs once.
WITH held AS (
    SELECT j.id, j.state, j.run_at, k AS key
    FROM evora.jobs j
    CROSS JOIN LATERAL unnest(('queue:' || j.queue) || j.limit_keys) AS k
    WHERE (j.state = 'RUNNING' OR (j.state = 'PENDING' AND j.run_at <= evora.clock_now()))
      AND starts_with(k, $1)
),
keys AS (
    -- a job counts once per key, even holding `queue:<its queue>` among its limit_keys too
    SELECT h.key, count(DISTINCT h.id) FILTER (WHERE h.state = 'RUNNING') AS running,
           count(DISTINCT h.id) FILTER (WHERE h.state = 'PENDING') AS due,
           min(h.run_at) FILTER (WHERE h.state = 'PENDING') AS since
    FROM held h
    GROUP BY h.key
),
governed AS (
    SELECT k.*, CASE WHEN $3::int4 IS NOT NULL THEN coalesce(
               (SELECT evora.tokens(b, $3::int4, $4::float8, evora.clock_now())
                FROM evora.flow_buckets b WHERE b.key = k.key), $3::int4) END AS tokens,
           coalesce((SELECT b.throttled_until > evora.clock_now()
                     FROM evora.flow_buckets b WHERE b.key = k.key), false) AS upstream
    FROM keys k
    WHERE NOT EXISTS (
        SELECT 1 FROM evora.flow_limits o
        WHERE o.key = k.key
           OR (o.stem IS NOT NULL AND length(o.stem) > length($1) AND starts_with(k.key, o.stem)))
)
SELECT coalesce(sum(g.running), 0)::bigint AS running, NULL::float8 AS tokens,
       coalesce(sum(g.due) FILTER (WHERE g.running >= $2::int4 OR g.tokens < 1 OR g.upstream),
                0)::bigint AS throttled_jobs,
       min(g.since) FILTER (WHERE g.running >= $2::int4 OR g.tokens < 1 OR g.upstream)
           AS throttled_since
FROM governed g;

-- name: governed_keys
-- $1 the limit's key, $2 its stem (NULL for a limit of one key), $3 key to continue after
-- (NULL: from the start), $4 page size, $5 concurrency, $6 rate limit, $7 rate period. A page
-- of the concrete keys the limit governs, in key order, each with its usage as key_usage has
-- it. For a limit of one key, that key; for a prefix limit, the keys under its stem without a
-- limit of their own or a longer prefix limit that have a bucket (made by their first claim
-- under a limit) or RUNNING jobs: a key with neither has all its room. Bounded by the page,
-- never by how many keys exist: the buckets are read in key order through their primary key
-- from where the page starts (the keys under a stem lie together in the database's C
-- collation; another collation only costs a longer scan), the RUNNING jobs once, and the due
-- PENDING jobs once, only when a key of the page has no room left.
WITH bucket_keys AS (
    SELECT b.key FROM evora.flow_buckets b
    WHERE $2::text IS NOT NULL AND b.key >= $2::text AND ($3::text IS NULL OR b.key > $3::text)
      AND starts_with(b.key, $2::text)
      AND NOT EXISTS (
          SELECT 1 FROM evora.flow_limits o
          WHERE o.key = b.key
             OR (o.stem IS NOT NULL AND length(o.stem) > length($2::text)
                 AND starts_with(b.key, o.stem)))
    ORDER BY b.key
    LIMIT $4
),
-- a job counts once per key, even holding `queue:<its queue>` among its limit_keys too
running AS (
    SELECT k AS key, count(DISTINCT r.id) AS n
    FROM evora.jobs r
    CROSS JOIN LATERAL unnest(('queue:' || r.queue) || r.limit_keys) AS k
    WHERE r.state = 'RUNNING'
      AND (CASE WHEN $2::text IS NULL THEN k = $1 ELSE starts_with(k, $2::text) END)
    GROUP BY k
),
page AS (
    SELECT x.key FROM (
        SELECT key FROM bucket_keys
        UNION
        SELECT r.key FROM running r
        WHERE ($3::text IS NULL OR r.key > $3::text)
          AND ($2::text IS NULL OR NOT EXISTS (
              SELECT 1 FROM evora.flow_limits o
              WHERE o.key = r.key
                 OR (o.stem IS NOT NULL AND length(o.stem) > length($2::text)
                     AND starts_with(r.key, o.stem))))
        UNION
        SELECT $1 WHERE $2::text IS NULL AND $3::text IS NULL
    ) AS x
    ORDER BY x.key
    LIMIT $4
),
usage AS (
    SELECT p.key, coalesce(r.n, 0)::bigint AS running,
           CASE WHEN $6::int4 IS NOT NULL THEN coalesce(
               (SELECT evora.tokens(b, $6::int4, $7::float8, evora.clock_now())
                FROM evora.flow_buckets b WHERE b.key = p.key), $6::int4) END AS tokens,
           (SELECT b.throttled_until FROM evora.flow_buckets b
            WHERE b.key = p.key AND b.throttled_until > evora.clock_now()) AS throttled_until
    FROM page p LEFT JOIN running r ON r.key = p.key
),
full_keys AS (
    SELECT u.key FROM usage u
    WHERE u.running >= $5::int4 OR u.tokens < 1 OR u.throttled_until IS NOT NULL
),
held AS (
    SELECT k AS key, count(DISTINCT p.id) AS jobs, min(p.run_at) AS since
    FROM evora.jobs p
    CROSS JOIN LATERAL unnest(('queue:' || p.queue) || p.limit_keys) AS k
    WHERE EXISTS (SELECT 1 FROM full_keys)
      AND p.state = 'PENDING' AND p.run_at <= evora.clock_now()
      AND k IN (SELECT key FROM full_keys)
    GROUP BY k
)
SELECT u.key, u.running, u.tokens, u.throttled_until, coalesce(h.jobs, 0)::bigint AS throttled_jobs,
       h.since AS throttled_since
FROM usage u LEFT JOIN held h ON h.key = u.key
ORDER BY u.key;

-- name: wake_limited_queues
-- $1 a limit's key, just set or deleted, $2 at most this many jobs holding it read. Sends the
-- queue's NOTIFY hint (as a job becoming claimable does) to every queue with a PENDING job
-- that holds a key the limit may govern, so workers waiting on jobs it held back claim again
-- at once; the queues notified. A hint too many only costs a claim, so this does not ask which
-- of those jobs the limit really held, and where finding the queues exactly would read the
-- backlog it wakes every queue with PENDING jobs instead: for a prefix limit (no index finds
-- keys by prefix), and for a key more than $2 PENDING jobs name among their limit_keys.
-- Bounded in the backlog: one probe of jobs_claimable per queue with PENDING jobs, and at most
-- $2 jobs read through jobs_waiting_limit_keys (tests/integration/test_generic_plans.py).
WITH RECURSIVE queues AS (
    -- the queues with PENDING jobs, one index probe each
    (SELECT j.queue FROM evora.jobs j WHERE j.state = 'PENDING' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM evora.jobs j
            WHERE j.state = 'PENDING' AND j.queue > q.queue ORDER BY j.queue LIMIT 1)
    FROM queues q WHERE q.queue IS NOT NULL
),
holding AS (
    -- the queues of up to $2 + 1 PENDING jobs naming the key (none for a prefix limit's)
    SELECT p.queue FROM evora.jobs p
    WHERE right($1, 1) <> '*' AND p.state = 'PENDING' AND p.limit_keys <> '{}'
      AND p.limit_keys @> ARRAY[$1::text]
    LIMIT $2 + 1
),
limited AS (
    SELECT q.queue FROM queues q
    WHERE q.queue IS NOT NULL
      AND ('queue:' || q.queue = $1 OR q.queue IN (SELECT h.queue FROM holding h)
           OR right($1, 1) = '*' OR (SELECT count(*) FROM holding) > $2)
)
SELECT coalesce(array_agg(l.queue ORDER BY l.queue), '{}') AS notified
FROM limited l, pg_notify('evora_jobs', l.queue);

-- name: clock
-- The database's clock now (not the transaction's start), to compare with sessions' starts.
SELECT clock_timestamp();

-- name: claims_begun_before
-- $1 an instant, $2 seconds: how many other client sessions of this database are in a
-- transaction that began before that instant and at most $2 seconds before it (a claim
-- among them may not have seen a limit committed at that instant). A claim lasts
-- milliseconds: a transaction open longer (a report, a dump, a session left idle in one)
-- is no claim, and a PUT must not wait for it. Autovacuum and other background processes
-- claim nothing. Sessions of other database users show no transaction start unless this
-- one may read their statistics (pg_read_all_stats), and are not counted.
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND pid <> pg_backend_pid() AND xact_start < $1
  AND xact_start > $1 - make_interval(secs => $2);

-- name: usage_by_kind
-- Per kind of key (what precedes its first ':', e.g. `tenant`, `queue`), over the keys live
-- jobs hold that a limit governs: RUNNING jobs holding them, tokens in their buckets (keys
-- with a rate), due PENDING jobs held back (holding a key without room left) and how long
-- the longest held back has been due. Reads every live job once.
WITH live AS (
    SELECT j.id, j.state, j.run_at, ('queue:' || j.queue) || j.limit_keys AS keys
    FROM evora.jobs j
    -- without any limit, nothing to read (a one-time filter: no scan)
    WHERE j.state IN ('PENDING', 'RUNNING') AND EXISTS (SELECT 1 FROM evora.flow_limits)
),
running AS (
    SELECT k AS key, count(*) AS n FROM live, unnest(live.keys) AS k
    WHERE live.state = 'RUNNING'
    GROUP BY k
),
governed AS (
    SELECT * FROM evora.governing_limits(ARRAY(SELECT DISTINCT k FROM live, unnest(live.keys) AS k))
),
usage AS (
    SELECT g.key, split_part(g.key, ':', 1) AS kind, coalesce(r.n, 0) AS running,
           CASE WHEN g.rate_limit IS NOT NULL THEN coalesce(
               (SELECT evora.tokens(b, g.rate_limit, g.rate_per_seconds, evora.clock_now())
                FROM evora.flow_buckets b WHERE b.key = g.key), g.rate_limit) END AS tokens,
           g.concurrency,
           -- an upstream drains the key (evora.drain_buckets()), with or without a rate
           coalesce((SELECT b.throttled_until > evora.clock_now()
                     FROM evora.flow_buckets b WHERE b.key = g.key), false) AS upstream
    FROM governed g
    LEFT JOIN running r ON r.key = g.key
),
held AS (
    SELECT u.kind, count(DISTINCT l.id) AS jobs, min(l.run_at) AS oldest
    FROM live l
    CROSS JOIN LATERAL unnest(l.keys) AS k
    JOIN usage u ON u.key = k AND (u.running >= u.concurrency OR u.tokens < 1 OR u.upstream)
    WHERE l.state = 'PENDING' AND l.run_at <= evora.clock_now()
    GROUP BY u.kind
)
SELECT u.kind, sum(u.running)::bigint AS running, sum(u.tokens) AS tokens,
       coalesce(max(h.jobs), 0)::bigint AS throttled_jobs,
       coalesce(extract(epoch FROM evora.clock_now() - min(h.oldest)), 0)::float8 AS throttled_seconds
FROM usage u
LEFT JOIN held h ON h.kind = u.kind
GROUP BY u.kind
ORDER BY u.kind;

-- name: throttled_limits
-- Every limit under which an upstream throttles some key now (evora.drain_buckets()), by the
-- limit's own key (a prefix limit's for the keys under it), with the latest time a key it
-- governs is throttled until: what metrics export, a series per configured limit at most.
-- Reads only the drained buckets (flow_buckets_throttled, migration 0044).
SELECT l.key, max(b.throttled_until) AS throttled_until
FROM evora.flow_buckets b
CROSS JOIN LATERAL (
    SELECT l.key FROM evora.flow_limits l
    WHERE l.key = b.key OR (l.stem IS NOT NULL AND starts_with(b.key, l.stem))
    ORDER BY l.key = b.key DESC, length(l.stem) DESC
    LIMIT 1
) AS l
WHERE b.throttled_until > evora.clock_now()
GROUP BY l.key;
