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
-- The buckets are locked in key order before they are deleted, the order in which a drain
-- (evora.drain_buckets(), an upstream's retry-after for several keys) takes them: deleted in
-- the order the scan met them, a prefix's buckets deadlocked with a drain of two of its keys
-- (tests/integration/test_lock_order.py). A claim never waits for a bucket.
WITH gone AS (
    DELETE FROM evora.flow_limits WHERE key = $1 RETURNING key, stem
),
held AS (
    SELECT b.key FROM evora.flow_buckets b, gone g
    WHERE b.key = g.key
       OR (g.stem IS NOT NULL AND starts_with(b.key, g.stem)
           AND NOT EXISTS (SELECT 1 FROM evora.flow_limits o WHERE o.key = b.key))
    ORDER BY b.key
    FOR UPDATE OF b
),
buckets AS (
    DELETE FROM evora.flow_buckets b USING held h WHERE b.key = h.key
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
-- back are counted up to $5 (a count of $5 means at least; evora.due_holding())
-- (tests/integration/test_generic_plans.py).
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
    SELECT count(*) AS jobs, min(c.run_at) AS since FROM evora.due_holding($1, $5) AS c
) AS h ON r.running >= $2::int4 OR t.tokens < 1 OR t.throttled_until IS NOT NULL;

-- name: key_depth
-- $1 a concrete key: how many jobs holding it wait to run (PENDING or WAITING), all counted.
SELECT evora.pending_holding($1, NULL);

-- name: prefix_usage
-- $1 stem of a prefix limit, $2 its concurrency, $3 rate limit, $4 rate period, $5 at most
-- this many held back counted. Summed over the keys it governs (those starting with the stem
-- that have no limit of their own and no longer prefix limit) that have RUNNING jobs or a
-- bucket that may be empty (made by their first claim under a limit; a key with neither has
-- all its room, as governed_keys has it): RUNNING jobs holding them, and due PENDING jobs
-- holding one without room left (an upstream's drain included), added up over the keys up to
-- $5 (a count of $5 means at least), with when the longest held back of those counted became
-- due. Bounded in the backlog: the RUNNING jobs read once, the buckets under the stem once
-- through their primary key, and at most $5 held back per key without room, up to $5 in all,
-- through evora.due_holding() (tests/integration/test_generic_plans.py,
-- test_limit_usage_cost.py).
WITH running AS (
    -- a job counts once per key, even holding `queue:<its queue>` among its limit_keys too
    SELECT k AS key, count(DISTINCT j.id) AS n
    FROM evora.jobs j
    CROSS JOIN LATERAL unnest(('queue:' || j.queue) || j.limit_keys) AS k
    WHERE j.state = 'RUNNING' AND starts_with(k, $1)
    GROUP BY k
),
keys AS (
    SELECT r.key, r.n AS running FROM running r
    UNION ALL
    -- without RUNNING jobs a key has no room only while drained, or with less than a token:
    -- refilled within the time the limit's rate takes to refill one (every other key adds
    -- nothing to the sums, and is not looked at)
    SELECT b.key, 0 FROM evora.flow_buckets b
    WHERE b.key >= $1 AND starts_with(b.key, $1)
      AND (b.throttled_until > evora.clock_now()
           OR (b.tokens < 1
               AND b.refilled_at > evora.clock_now() - make_interval(secs => $4::float8 / $3)))
      AND NOT EXISTS (SELECT 1 FROM running r WHERE r.key = b.key)
),
governed AS (
    SELECT k.key, k.running, CASE WHEN $3::int4 IS NOT NULL THEN coalesce(
               (SELECT evora.tokens(b, $3::int4, $4::float8, evora.clock_now())
                FROM evora.flow_buckets b WHERE b.key = k.key), $3::int4) END AS tokens,
           coalesce((SELECT b.throttled_until > evora.clock_now()
                     FROM evora.flow_buckets b WHERE b.key = k.key), false) AS upstream
    FROM keys k
    WHERE NOT EXISTS (
        SELECT 1 FROM evora.flow_limits o
        WHERE o.key = k.key
           OR (o.stem IS NOT NULL AND length(o.stem) > length($1) AND starts_with(k.key, o.stem)))
),
held AS (
    SELECT count(*) AS jobs, min(h.run_at) AS since FROM (
        SELECT d.id, d.run_at
        FROM governed g CROSS JOIN LATERAL evora.due_holding(g.key, $5) AS d
        WHERE g.running >= $2::int4 OR g.tokens < 1 OR g.upstream
        LIMIT $5
    ) AS h
)
SELECT (SELECT coalesce(sum(g.running), 0) FROM governed g)::bigint AS running,
       NULL::float8 AS tokens, h.jobs::bigint AS throttled_jobs, h.since AS throttled_since
FROM held h;

-- name: governed_keys
-- $1 the limit's key, $2 its stem (NULL for a limit of one key), $3 key to continue after
-- (NULL: from the start), $4 page size, $5 concurrency, $6 rate limit, $7 rate period, $8 at
-- most this many held back counted per key (a count of $8 means at least). A page
-- of the concrete keys the limit governs, in key order, each with its usage as key_usage has
-- it. For a limit of one key, that key; for a prefix limit, the keys under its stem without a
-- limit of their own or a longer prefix limit that have a bucket (made by their first claim
-- under a limit) or RUNNING jobs: a key with neither has all its room. Bounded by the page,
-- never by how many keys exist: the buckets are read in key order through their primary key
-- from where the page starts (the keys under a stem lie together in the database's C
-- collation; another collation only costs a longer scan), the RUNNING jobs once, and for
-- each key of the page without room left at most $8 due PENDING jobs (evora.due_holding()).
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
    SELECT f.key, count(*) AS jobs, min(d.run_at) AS since
    FROM full_keys f CROSS JOIN LATERAL evora.due_holding(f.key, $8) AS d
    GROUP BY f.key
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
WITH queues AS (
    SELECT p.queue FROM evora.pending_queues() AS p
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
-- $1 at most this many held back counted per kind. Per kind of key (what precedes its first
-- ':', e.g. `tenant`, `queue`), over the keys a limit governs that RUNNING jobs hold, and
-- those with a limit of their own or a bucket that may be empty (see below) that a due
-- PENDING job holds: RUNNING jobs holding them, tokens in their buckets (keys with a rate),
-- due PENDING jobs held back (holding a key without room left) and how long the longest held
-- back of those counted has been due. A key has no room when its RUNNING holders reach its
-- concurrency (at least 1: it is among those RUNNING jobs hold), when an upstream drains it,
-- or when its bucket has less than a token, which it can only have if refilled within the
-- time the slowest rate of any limit takes to refill one: so the buckets probed are the
-- drained and the recently refilled, not every key ever claimed. Keys with room that only
-- PENDING jobs hold are left out (no tokens counted for them: they are claimed next). Bounded
-- in the backlog: the RUNNING jobs read once, the buckets once, the limits' own keys and
-- those buckets each probed once for a due holder, and of each kind at most $1 held back read
-- through evora.due_holding(), a job counted once (a count of $1 means at least;
-- tests/integration/test_generic_plans.py).
WITH running AS (
    SELECT k AS key, count(*) AS n
    FROM evora.jobs j, unnest(('queue:' || j.queue) || j.limit_keys) AS k
    -- without any limit, nothing to read (a one-time filter: no scan)
    WHERE j.state = 'RUNNING' AND EXISTS (SELECT 1 FROM evora.flow_limits)
    GROUP BY k
),
held_keys AS (
    SELECT r.key FROM running r
    UNION
    SELECT c.key FROM (
        SELECT l.key FROM evora.flow_limits l WHERE l.stem IS NULL
        UNION
        SELECT b.key FROM evora.flow_buckets b
        WHERE b.throttled_until > evora.clock_now()
           OR (b.tokens < 1 AND b.refilled_at > evora.clock_now() - (
                   SELECT make_interval(secs => max(l.rate_per_seconds / l.rate_limit))
                   FROM evora.flow_limits l WHERE l.rate_limit IS NOT NULL))
    ) AS c
    WHERE EXISTS (SELECT 1 FROM evora.due_holding(c.key, 1))
),
governed AS (
    SELECT * FROM evora.governing_limits(ARRAY(SELECT h.key FROM held_keys h))
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
    SELECT k.kind, count(DISTINCT h.id) AS jobs, min(h.run_at) AS oldest
    FROM (SELECT DISTINCT u.kind FROM usage u) AS k
    CROSS JOIN LATERAL (
        SELECT d.id, d.run_at
        FROM usage u CROSS JOIN LATERAL evora.due_holding(u.key, $1) AS d
        WHERE u.kind = k.kind AND (u.running >= u.concurrency OR u.tokens < 1 OR u.upstream)
        LIMIT $1
    ) AS h
    GROUP BY k.kind
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
