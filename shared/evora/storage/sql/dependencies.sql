-- Reading the dependency graph (migration 0013 made its tables; the triggers of
-- functions/dependencies.sql move waiting jobs).

-- name: dependents
-- $1 id, $2 page size + 1, $3 submit_seq to start after (NULL: the first page). The jobs
-- that depend on $1, in submission order, through the index on the dependency's side.
SELECT j.*
FROM evora.job_dependencies d
JOIN evora.jobs j ON j.id = d.job_id
WHERE d.depends_on = $1 AND ($3::int8 IS NULL OR j.submit_seq > $3::int8)
ORDER BY j.submit_seq
LIMIT $2;

-- name: job_exists
-- $1 id.
SELECT EXISTS (SELECT 1 FROM evora.jobs WHERE id = $1);
