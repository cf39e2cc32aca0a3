-- Fairness weights (docs/flow-control.md, "Fairness keys"): setting them, and what the fair
-- claim (evora.claim_fair(), functions/fairness.sql) has served each key.

-- name: put_fairness_weight
-- $1 key (`tenant:*`: every key under the prefix, each on its own), $2 weight. The weight,
-- and whether it is new. Claims use it from their next statement on.
INSERT INTO evora.fairness_weights AS w (key, weight, changed_at)
VALUES ($1, $2, evora.clock_now())
ON CONFLICT (key) DO UPDATE SET weight = excluded.weight, changed_at = excluded.changed_at
RETURNING w.key, w.weight, w.changed_at, (xmax = 0) AS created;

-- name: get_fairness_weight
-- $1 key: the weight that applies to it (its own, else the longest prefix's, else 1), which
-- key set it (NULL: the default), and per queue what the fair claim served it.
SELECT $1::text AS key, evora.fairness_weight($1) AS weight,
       evora.fairness_weight_set_by($1) AS set_by,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'queue', k.queue, 'served', k.served, 'held_seconds', k.held_seconds,
                     'running', k.running, 'backlogged', k.backlogged,
                     'lag', k.vfinish - f.vtime) ORDER BY k.queue)
                 FROM evora.fair_keys k JOIN evora.fair_queues f ON f.queue = k.queue
                 WHERE k.key = $1), '[]') AS queues;

-- name: delete_fairness_weight
-- $1 key. The key, if it had a weight of its own.
DELETE FROM evora.fairness_weights WHERE key = $1 RETURNING key;

-- name: fairness_shares
-- $1 queue. Each key of the queue with what the fair claim served it (claims, lease seconds
-- held by ended attempts), its weight now, and whether it has work: for the metrics and the
-- audit. Bounded by the caller: the $2 keys with the most held time.
SELECT k.key, evora.fairness_weight(k.key) AS weight, k.served, k.held_seconds, k.running,
       k.backlogged, k.vfinish - f.vtime AS lag
FROM evora.fair_keys k JOIN evora.fair_queues f ON f.queue = k.queue
WHERE k.queue = $1
ORDER BY k.held_seconds DESC, k.key
LIMIT $2;

-- name: fairness_by_kind
-- Per fair queue and kind of key (what precedes its first ':', e.g. `tenant`; the whole key
-- when it has none), for the metrics: the keys with work, the due PENDING jobs waiting and
-- how long the longest has waited, and the lease seconds the kind's ended attempts held
-- since the queue became fair (its share of the workers is the rate of this over the
-- queue's). Reads the fair queues' keys once and their due keyed jobs once
-- (jobs_fair_backlog).
WITH keys AS (
    SELECT k.queue, split_part(k.key, ':', 1) AS kind,
           count(*) FILTER (WHERE k.backlogged) AS backlogged_keys,
           sum(k.held_seconds) AS held_seconds, sum(k.served) AS served
    FROM evora.fair_keys k
    GROUP BY 1, 2
),
waiting AS (
    SELECT j.queue, split_part(j.fairness_key, ':', 1) AS kind, count(*) AS jobs,
           extract(epoch FROM evora.clock_now() - min(j.run_at))::float8 AS seconds
    FROM evora.fair_queues f
    JOIN evora.jobs j ON j.queue = f.queue
    WHERE j.state = 'PENDING' AND j.fairness_key IS NOT NULL AND j.run_at <= evora.clock_now()
    GROUP BY 1, 2
)
SELECT k.queue, k.kind, k.backlogged_keys, coalesce(w.jobs, 0) AS waiting_jobs,
       coalesce(w.seconds, 0) AS waiting_seconds, k.held_seconds, k.served
FROM keys k LEFT JOIN waiting w ON w.queue = k.queue AND w.kind = k.kind
ORDER BY k.queue, k.kind;

-- name: fair_queues_summary
-- The fair queues (one row each: a queue becomes fair with its first keyed job), each with
-- how many keys it has served or noted and how many of them its claims walk now.
SELECT f.queue, count(k.key) AS keys, count(k.key) FILTER (WHERE k.backlogged) AS backlogged_keys
FROM evora.fair_queues f
LEFT JOIN evora.fair_keys k ON k.queue = f.queue
GROUP BY f.queue
ORDER BY f.queue;

-- name: fair_keys_page
-- $1 queue, $2 the last key of the previous page (NULL: from the first), $3 keys. A page of
-- the queue's keys in key order (the dashboard's Fairness page), each with the weight that
-- applies and which key or prefix set it, its due PENDING jobs and how long the longest has
-- waited (probes of jobs_fair_backlog, per key of the page), the lease seconds its ended
-- attempts held, and two shares of the queue: of the held time, and of the sum of its keys'
-- weights (what it is owed while every key has work). The shares read every key of the
-- queue once.
WITH totals AS (
    SELECT sum(k.held_seconds) AS held, sum(evora.fairness_weight(k.key)) AS weight
    FROM evora.fair_keys k
    WHERE k.queue = $1
),
page AS (
    SELECT k.key, k.served, k.running, k.held_seconds, k.backlogged
    FROM evora.fair_keys k
    WHERE k.queue = $1 AND ($2::text IS NULL OR k.key > $2)
    ORDER BY k.key
    LIMIT $3
)
SELECT p.key, evora.fairness_weight(p.key) AS weight, evora.fairness_weight_set_by(p.key) AS set_by,
       p.served, p.running, p.held_seconds, p.backlogged, b.jobs AS backlog,
       b.waited AS longest_wait_seconds,
       p.held_seconds / nullif(t.held, 0) AS held_share,
       evora.fairness_weight(p.key) / t.weight AS weight_share
FROM page p
CROSS JOIN totals t
CROSS JOIN LATERAL (
    SELECT count(*) AS jobs,
           extract(epoch FROM evora.clock_now() - min(j.run_at))::float8 AS waited
    FROM evora.jobs j
    WHERE j.queue = $1 AND j.fairness_key = p.key AND j.state = 'PENDING'
      AND j.run_at <= evora.clock_now()
) AS b
ORDER BY p.key;
