-- Pausing queues, and the NOTIFY hints that wake dispatchers (channel `evora_jobs`, the
-- queue's name as payload).

-- name: pause_queue
-- $1 queue.
INSERT INTO evora.paused_queues (queue) VALUES ($1) ON CONFLICT DO NOTHING;

-- name: resume_queue
-- $1 queue: resuming wakes the dispatchers waiting on it.
WITH resumed AS (DELETE FROM evora.paused_queues WHERE queue = $1 RETURNING queue)
SELECT count(pg_notify('evora_jobs', queue)) FROM resumed;

-- name: paused_queues
-- $1 queues: those of them that are paused.
SELECT queue FROM evora.paused_queues WHERE queue = ANY($1::text[]);

-- name: all_paused_queues
-- Every paused queue.
SELECT queue FROM evora.paused_queues ORDER BY queue;

-- name: notify_queues
-- $1 queues: the trailing hints a writer owes for changes it did not announce (notify.py).
SELECT pg_notify('evora_jobs', q) FROM unnest($1::text[]) AS q;
