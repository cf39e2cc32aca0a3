-- Children awaited without holding a slot (docs/jobs-that-wait.md): a running job submits its
-- children and waits for them, in one transaction (JobStore.spawn_children).

-- name: hold_parent
-- $1 id, $2 lease token. Locks the RUNNING job held under the lease, first in the transaction,
-- so its children are stored only for the attempt that owns it and nothing else moves it
-- meanwhile. Exactly one row: the outcome ('done', 'lease_lost', 'not_found') and, when done,
-- whether a cancel was requested (then the children are not submitted: the job is cancelled).
WITH held AS (
    SELECT j.cancel_requested FROM evora.jobs j
    WHERE j.id = $1 AND j.lease_token = $2 AND j.state = 'RUNNING'
    FOR UPDATE
)
SELECT CASE WHEN h.cancel_requested IS NOT NULL THEN 'done'
            WHEN EXISTS (SELECT 1 FROM evora.jobs WHERE id = $1) THEN 'lease_lost'
            ELSE 'not_found' END AS outcome,
       h.cancel_requested
FROM (VALUES (1)) AS one(x)
LEFT JOIN held h ON true;

-- name: await_children
-- $1 id (held by hold_parent in this transaction), $2 the children's ids (stored in this
-- transaction), $3 on_dependency_failure (NULL: the job's), $4 suppressed queues. The job
-- waits for them (evora.await_children(), functions/dependencies.sql). Exactly one row: the
-- outcome ('done', or 'cancelled_dependency' with the child that refuses it: roll back).
SELECT outcome, cause, job, notified, owed
FROM evora.await_children($1::uuid, $2::uuid[], $3::text, $4::text[]);

-- name: record_children
-- $1 id (waiting for its children in this transaction), $2 the children its spawn created
-- (not those an idempotency key replayed): a cancel of the job cancels them with it
-- (evora.spawned_tree(), functions/dependencies.sql).
INSERT INTO evora.spawned_children (parent, child)
SELECT $1, c FROM unnest($2::uuid[]) AS c
ON CONFLICT DO NOTHING;
