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
       coalesce((SELECT w.key FROM evora.fairness_weights w WHERE w.key = $1),
                (SELECT w.key FROM evora.fairness_weights w
                 WHERE w.stem IS NOT NULL AND starts_with($1, w.stem)
                 ORDER BY length(w.stem) DESC LIMIT 1)) AS set_by,
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
