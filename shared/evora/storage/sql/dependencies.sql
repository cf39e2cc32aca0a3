-- Reading the dependency graph (migration 0013 stores it; its trigger moves waiting jobs).

-- name: dependents
-- $1 id, $2 page size + 1, $3 submit_seq to start after (NULL: the first page). The jobs
-- that depend on $1, in submission order, through the index on the dependency's side.
SELECT j.*
FROM job_dependencies d
JOIN jobs j ON j.id = d.job_id
WHERE d.depends_on = $1 AND ($3::int8 IS NULL OR j.submit_seq > $3::int8)
ORDER BY j.submit_seq
LIMIT $2;

-- name: job_exists
-- $1 id.
SELECT EXISTS (SELECT 1 FROM jobs WHERE id = $1);

-- name: dependency_results
-- $1 claimed jobs that have dependencies. The result of each of their COMPLETED
-- dependencies, in depends_on order (a dependency since pruned by retention is left out).
SELECT c.id AS job_id, d.id AS dependency, d.result
FROM jobs c
CROSS JOIN LATERAL unnest(c.depends_on) WITH ORDINALITY AS u(id, n)
JOIN jobs d ON d.id = u.id
WHERE c.id = ANY($1::uuid[]) AND d.state = 'COMPLETED'
ORDER BY c.id, u.n;
