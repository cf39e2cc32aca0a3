-- Evora schema, version 62: the limited claim counts a key's RUNNING holders through
-- jobs_running_limit_keys under any plan, not by walking every RUNNING job.
--
-- The index held the RUNNING jobs with keys `WHERE state = 'RUNNING' AND limit_keys <> '{}'`,
-- and the count stated the same condition to use it. A partial index is usable without any
-- condition on its columns wherever the query implies its predicate, so that condition made
-- every other partial index of RUNNING jobs usable too, walked whole with the keys as a
-- filter: jobs_running_lease, or any index of RUNNING jobs added later. Planned on a table
-- of a few jobs (a connection's kept plan, made when the service started), such a walk
-- looks cheaper than the GIN probe, and it read every RUNNING job on every later claim
-- (tests/integration/test_plan_traps.py: 414 rows to claim one job beside 200 running).
--
-- The predicate is now `state >= 'RUNNING' AND state <= 'RUNNING'`: the same rows, written
-- as two comparisons. (Not as `state BETWEEN ...`: PostgreSQL keeps a BETWEEN's two
-- comparisons as an AND nested in the predicate's, which a dump restores flattened, so
-- `evora migrate --check` on a restored database would call the index changed.) The limited claim's count states them; from them the planner cannot
-- derive `state = 'RUNNING'`, so no other partial index of RUNNING jobs is usable there, and
-- the choice left is the GIN probe or a pass over the whole table, which under the claim's
-- `random_page_cost = 1` costs more than the probe even on a table of a few pages (12.4
-- against 3.6 on a new installation). A statement that says `state = 'RUNNING'` still
-- implies the new predicate and may use the index as before (evora.running_holding()).
--
-- Building it locks `jobs` against writes while it reads the RUNNING jobs with keys (a
-- sequential scan of the table; docs/deploy.md, Upgrades). The functions that state the new
-- predicate are made in the same transaction (the function files run after this).
DROP INDEX IF EXISTS evora.jobs_running_limit_keys;
CREATE INDEX jobs_running_limit_keys ON evora.jobs USING gin (limit_keys)
    WITH (fastupdate = off)
    WHERE state >= 'RUNNING' AND state <= 'RUNNING' AND limit_keys <> '{}';
