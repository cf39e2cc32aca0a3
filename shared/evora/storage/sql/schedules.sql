-- Schedules (migrations/0012_schedules.sql). The tick arithmetic is done in Python
-- (evora.domain.cron); these statements store its results. Changes to one schedule are
-- made under its row lock, so the scheduler, PUT, pause, resume and trigger serialise.

-- name: lock
-- $1 name: the schedule, locked for a change in this transaction. `job_text` is its job as
-- jsonb writes it: its payload's numbers as stored (the codec makes floats of them).
SELECT *, job::text AS job_text FROM evora.schedules WHERE name = $1 FOR UPDATE;

-- name: unmeetable_dependencies
-- $1 the jobs a schedule's job depends on, $2 whether a CANCELLED one is refused (its
-- on_dependency_failure is "cancel"): those no tick's job could ever wait for, by position
-- (from 1).
SELECT d.ord, d.id
FROM unnest($1::uuid[]) WITH ORDINALITY AS d(id, ord)
WHERE NOT EXISTS (SELECT FROM evora.jobs j WHERE j.id = d.id AND NOT ($2 AND j.state = 'CANCELLED'))
ORDER BY d.ord;

-- name: upsert
-- $1 name, $2 cron, $3 timezone, $4 job, $5 misfire, $6 grace seconds, $7 paused,
-- $8 ticked_until, $9 next_run_at. `created` tells a new schedule from a replaced one.
INSERT INTO evora.schedules AS s (name, cron, timezone, job, misfire, misfire_grace_seconds,
                            paused, ticked_until, next_run_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (name) DO UPDATE SET
    cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, job = EXCLUDED.job,
    misfire = EXCLUDED.misfire, misfire_grace_seconds = EXCLUDED.misfire_grace_seconds,
    paused = EXCLUDED.paused, ticked_until = EXCLUDED.ticked_until,
    next_run_at = EXCLUDED.next_run_at, updated_at = now()
RETURNING s.*, (xmax = 0) AS created;

-- name: get
-- $1 name.
SELECT * FROM evora.schedules WHERE name = $1;

-- name: page
-- $1 the last name of the previous page (NULL: from the start), $2 how many.
SELECT * FROM evora.schedules WHERE $1::text IS NULL OR name > $1 ORDER BY name LIMIT $2;

-- name: delete
-- $1 name. Jobs it made stay.
DELETE FROM evora.schedules WHERE name = $1 RETURNING name;

-- name: pause
-- $1 name.
UPDATE evora.schedules SET paused = true, updated_at = now() WHERE name = $1 RETURNING *;

-- name: resume
-- $1 name, $2 ticked_until, $3 next_run_at: ticks while it was paused stay unmade.
UPDATE evora.schedules
SET paused = false, ticked_until = $2, next_run_at = $3, updated_at = now()
WHERE name = $1
RETURNING *;

-- name: take_due
-- $1 now (the scheduler's clock): one due schedule no other transaction holds, locked.
-- SKIP LOCKED spreads due schedules over the replicas; none waits for another. `job_text`
-- as in `lock`.
SELECT *, job::text AS job_text FROM evora.schedules
WHERE NOT paused AND next_run_at <= $1
ORDER BY next_run_at
LIMIT 1
FOR UPDATE SKIP LOCKED;

-- name: advance
-- $1 name, $2 ticked_until, $3 next_run_at, $4 last_run_at and $5 last_job_id (NULL: as
-- they were). A job made ends a failing streak (the last error stays on record); a step
-- whose ticks were all missed by its policy proves nothing either way.
UPDATE evora.schedules
SET ticked_until = $2, next_run_at = $3,
    last_run_at = coalesce($4, last_run_at), last_job_id = coalesce($5, last_job_id),
    failing_since = CASE WHEN $5::uuid IS NULL THEN failing_since END,
    consecutive_failures = CASE WHEN $5::uuid IS NULL THEN consecutive_failures ELSE 0 END
WHERE name = $1;

-- name: fail
-- $1 name, $2 ticked_until, $3 next_run_at (NULL: it stops until it is put again), $4 the
-- error ({"message", "type"}), $5 now (the scheduler's clock). The ticks of the failed step
-- count as handled, so the schedule waits for its next tick instead of being due at once.
UPDATE evora.schedules
SET ticked_until = $2, next_run_at = $3, last_error = $4, last_error_at = $5,
    failing_since = coalesce(failing_since, $5),
    consecutive_failures = consecutive_failures + 1
WHERE name = $1;

-- name: earliest_due
-- When the next tick of any running schedule is due (NULL: none is).
SELECT min(next_run_at) FROM evora.schedules WHERE NOT paused;

-- name: name_submission
-- $1 the data the next `submitted` events of this transaction carry
-- (evora.store_submissions() adds it to theirs).
SELECT set_config('evora.submitted_data', $1, true);
