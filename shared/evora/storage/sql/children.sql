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

-- name: hold_spawned_tree
-- $1 id. Locks, in id order, the unfinished jobs a cancel of the job would cancel with it
-- (evora.spawned_tree()), before the job itself: a child ending locks the child first and its
-- waiting parent next (the dependency settlement), so a cancel that took the parent first
-- and then waited for that child would deadlock with it.
SELECT j.id FROM evora.jobs j
WHERE j.id IN (SELECT evora.spawned_tree($1))
ORDER BY j.id
FOR UPDATE;

-- name: cancel_spawned_tree
-- $1 id (cancelled in this transaction), $2 suppressed queues. Cancels what
-- evora.spawned_tree() names, read again now that the job is held (a spawn committing
-- meanwhile made children hold_spawned_tree could not see), in one statement whatever their
-- number (a fan-out of 10,000: one settlement of their dependents, not one per child), by
-- the rules of the `cancel` statement (transitions.sql), joined by id for the same reason:
-- PENDING, WAITING and SUSPENDED at once (a callback settled `cancelled`), RUNNING by
-- cancel_requested. Exactly one row: the hints, as `cancel`'s.
WITH target AS (
    SELECT j.id, j.state FROM evora.jobs j
    WHERE j.id IN (SELECT evora.spawned_tree($1))
      AND (j.state IN ('PENDING', 'WAITING', 'SUSPENDED')
           OR (j.state = 'RUNNING' AND NOT j.cancel_requested))
    ORDER BY j.id
    FOR UPDATE
),
moved AS (
    UPDATE evora.jobs j
    SET state = CASE WHEN t.state = 'RUNNING' THEN j.state ELSE 'CANCELLED' END,
        cancel_requested = (t.state = 'RUNNING'),
        finished_at = CASE WHEN t.state = 'RUNNING' THEN NULL ELSE evora.clock_now() END,
        updated_at = evora.clock_now(), version = j.version + 1
    FROM target t WHERE j.id = t.id
    RETURNING j.id, t.state AS from_state,
        ROW(j, CASE WHEN t.state = 'RUNNING' THEN 'cancel_requested' ELSE 'cancelled' END,
            t.state, j.worker_id, '{}')::evora.move AS move
),
voided AS (
    UPDATE evora.callbacks c SET outcome = 'cancelled', settled_at = evora.clock_now()
    FROM moved m
    WHERE m.from_state = 'SUSPENDED' AND c.job_id = m.id AND c.outcome IS NULL
)
SELECT r.notified, r.owed
FROM evora.record_moves(ARRAY(SELECT move FROM moved), $2::text[]) AS r;
