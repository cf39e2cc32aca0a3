-- Checkpoints (docs/jobs-that-wait.md): the steps a handler recorded, kept on its job
-- (jobs.checkpoints, name -> data) and handed to the job's next attempt with its claim.

-- name: checkpoint
-- $1 id, $2 lease token, $3 name, $4 data, $5 the most names a job may hold, $6 the most
-- bytes they may take together (the map's JSON text). Adds or replaces the name's data,
-- fenced like a completion: only the attempt holding the lease, while RUNNING. One event
-- `checkpointed` (RUNNING -> RUNNING, data: the name, never the data), a new version, as a
-- cancel request is recorded. Exactly one row: the outcome ('done', 'too_large' when the map
-- would go over $5 or $6: nothing stored, 'lease_lost', 'not_found') and, when done, the
-- job's checkpoints.
-- `target` locks the row and computes the new map; a concurrent checkpoint of the same job
-- is waited for, and the locked row's newest version (re-checked, EvalPlanQual) is what the
-- map is computed from, so neither overwrites the other's name. The UPDATE joins by id
-- alone for the reason given at `cancel` (storage/sql/transitions.sql).
WITH target AS (
    SELECT j.id, coalesce(j.checkpoints, '{}') || jsonb_build_object($3::text, $4::jsonb) AS merged
    FROM evora.jobs j
    WHERE j.id = $1 AND j.lease_token = $2 AND j.state = 'RUNNING'
    FOR UPDATE
),
fits AS (
    SELECT t.id, t.merged FROM target t
    WHERE (SELECT count(*) FROM jsonb_object_keys(t.merged)) <= $5::int4
      AND octet_length(t.merged::text) <= $6::int4
),
moved AS (
    UPDATE evora.jobs j
    SET checkpoints = f.merged, updated_at = evora.clock_now(), version = j.version + 1
    FROM fits f WHERE j.id = f.id
    RETURNING j.id, j.checkpoints, j.version, j.queue, j.type, j.attempt, j.worker_id,
              j.updated_at, evora.event_image(j, 'RUNNING') AS image
),
recorded AS (
    INSERT INTO evora.job_event_rows (job_id, job_version, queue, type, event, from_state, to_state,
                                  attempt, worker_id, at, data, job)
    SELECT m.id, m.version, m.queue, m.type, 'checkpointed', 'RUNNING', 'RUNNING', m.attempt,
           m.worker_id, m.updated_at, jsonb_build_object('name', $3::text), m.image
    FROM moved m
)
SELECT CASE WHEN m.id IS NOT NULL THEN 'done'
            WHEN EXISTS (SELECT 1 FROM target) THEN 'too_large'
            WHEN EXISTS (SELECT 1 FROM evora.jobs WHERE id = $1) THEN 'lease_lost'
            ELSE 'not_found' END AS outcome,
       m.checkpoints
FROM (VALUES (1)) AS one(x)
LEFT JOIN moved m ON true;
