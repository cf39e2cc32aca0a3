-- Concurrency and rate limits (docs/flow-control.md): defining them, and their live usage.
-- Enforcing them is the claim's (transitions.sql, migration 0014).

-- name: put_limit
-- $1 key, $2 concurrency, $3 rate limit, $4 rate period in seconds. The limit, and whether it
-- is new.
INSERT INTO flow_limits AS l (key, concurrency, rate_limit, rate_per_seconds)
VALUES ($1, $2, $3, $4)
ON CONFLICT (key) DO UPDATE
SET concurrency = excluded.concurrency, rate_limit = excluded.rate_limit,
    rate_per_seconds = excluded.rate_per_seconds, updated_at = now()
RETURNING l.key, l.concurrency, l.rate_limit, l.rate_per_seconds, l.created_at, l.updated_at,
          (xmax = 0) AS created;

-- name: delete_limit
-- $1 key. Its buckets go with it (for a prefix limit, those of the keys under its stem
-- without a limit of their own); the key, if it was deleted.
WITH gone AS (
    DELETE FROM flow_limits WHERE key = $1 RETURNING key, stem
),
buckets AS (
    DELETE FROM flow_buckets b
    USING gone g
    WHERE b.key = g.key
       OR (g.stem IS NOT NULL AND starts_with(b.key, g.stem)
           AND NOT EXISTS (SELECT 1 FROM flow_limits o WHERE o.key = b.key))
)
SELECT key FROM gone;

-- name: list_limits
-- $1 key to continue after (NULL: from the start), $2 page size.
SELECT key, concurrency, rate_limit, rate_per_seconds, created_at, updated_at
FROM flow_limits
WHERE $1::text IS NULL OR key > $1
ORDER BY key
LIMIT $2;

-- name: governing_limit
-- $1 key: the limit that governs it (its own, else the longest prefix limit whose stem it
-- starts with), with that limit's own key; no row when none does.
SELECT l.key, l.concurrency, l.rate_limit, l.rate_per_seconds, l.created_at, l.updated_at
FROM flow_limits l
WHERE l.key = $1 OR (l.stem IS NOT NULL AND starts_with($1, l.stem))
ORDER BY l.key = $1 DESC, length(l.stem) DESC
LIMIT 1;

-- name: key_usage
-- $1 keys, $2 concurrency, $3 rate limit, $4 rate period: summed over the keys, RUNNING jobs
-- holding them, tokens in their buckets now (NULL without a rate; a key never claimed has a
-- full bucket) and due PENDING jobs holding a key that has no room left.
SELECT coalesce(sum(u.running), 0)::bigint AS running,
       sum(u.tokens) AS tokens,
       coalesce(sum(u.throttled), 0)::bigint AS throttled_jobs
FROM unnest($1::text[]) AS k(key)
CROSS JOIN LATERAL (SELECT evora_running_holding(k.key) AS running) AS r
CROSS JOIN LATERAL (
    SELECT CASE WHEN $3::int4 IS NOT NULL THEN coalesce(
               (SELECT evora_tokens(b, $3::int4, $4::float8, evora_now())
                FROM flow_buckets b WHERE b.key = k.key), $3::int4) END AS tokens
) AS t
CROSS JOIN LATERAL (
    SELECT r.running, t.tokens,
           CASE WHEN r.running >= $2::int4 OR t.tokens < 1 THEN (
               SELECT count(*) FROM jobs p
               WHERE p.state = 'PENDING' AND p.run_at <= evora_now()
                 AND ((starts_with(k.key, 'queue:') AND p.queue = substr(k.key, 7))
                      OR p.limit_keys @> ARRAY[k.key]))
           ELSE 0 END AS throttled
) AS u;

-- name: keys_under
-- $1 stem: the keys live jobs (PENDING or RUNNING) hold that start with it.
SELECT coalesce(array_agg(DISTINCT x.key), '{}') AS keys
FROM (
    SELECT k AS key FROM jobs j, unnest(j.limit_keys) AS k
    WHERE j.state IN ('PENDING', 'RUNNING') AND j.limit_keys <> '{}' AND starts_with(k, $1)
    UNION
    SELECT 'queue:' || q.queue FROM (
        SELECT DISTINCT queue FROM jobs WHERE state IN ('PENDING', 'RUNNING')
    ) AS q
    WHERE starts_with('queue:' || q.queue, $1)
) AS x;

-- name: usage_by_kind
-- Per kind of key (what precedes its first ':', e.g. `tenant`, `queue`), over the keys live
-- jobs hold that a limit governs: RUNNING jobs holding them, tokens in their buckets (keys
-- with a rate), due PENDING jobs held back (holding a key without room left) and how long
-- the longest held back has been due. Reads every live job once.
WITH live AS (
    SELECT j.id, j.state, j.run_at, ('queue:' || j.queue) || j.limit_keys AS keys
    FROM jobs j
    -- without any limit, nothing to read (a one-time filter: no scan)
    WHERE j.state IN ('PENDING', 'RUNNING') AND EXISTS (SELECT 1 FROM flow_limits)
),
running AS (
    SELECT k AS key, count(*) AS n FROM live, unnest(live.keys) AS k
    WHERE live.state = 'RUNNING'
    GROUP BY k
),
governed AS (
    SELECT * FROM evora_governing_limits(ARRAY(SELECT DISTINCT k FROM live, unnest(live.keys) AS k))
),
usage AS (
    SELECT g.key, split_part(g.key, ':', 1) AS kind, coalesce(r.n, 0) AS running,
           CASE WHEN g.rate_limit IS NOT NULL THEN coalesce(
               (SELECT evora_tokens(b, g.rate_limit, g.rate_per_seconds, evora_now())
                FROM flow_buckets b WHERE b.key = g.key), g.rate_limit) END AS tokens,
           g.concurrency
    FROM governed g
    LEFT JOIN running r ON r.key = g.key
),
held AS (
    SELECT u.kind, count(DISTINCT l.id) AS jobs, min(l.run_at) AS oldest
    FROM live l
    CROSS JOIN LATERAL unnest(l.keys) AS k
    JOIN usage u ON u.key = k AND (u.running >= u.concurrency OR u.tokens < 1)
    WHERE l.state = 'PENDING' AND l.run_at <= evora_now()
    GROUP BY u.kind
)
SELECT u.kind, sum(u.running)::bigint AS running, sum(u.tokens) AS tokens,
       coalesce(max(h.jobs), 0)::bigint AS throttled_jobs,
       coalesce(extract(epoch FROM evora_now() - min(h.oldest)), 0)::float8 AS throttled_seconds
FROM usage u
LEFT JOIN held h ON h.kind = u.kind
GROUP BY u.kind
ORDER BY u.kind;
