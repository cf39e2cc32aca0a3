-- Evora schema, version 5: plans that do not depend on when jobs was last analyzed.
--
-- A queue table is usually analyzed while almost nothing is PENDING or RUNNING. The planner
-- then expects one row per state and picks plans that scan a whole partial index as the
-- outer side of a nested loop; with a backlog, one claim of 500 jobs took seconds.
-- Without statistics on `state` the planner uses its default selectivity and keeps to the
-- primary key and the partial indexes' order, whatever the backlog.

ALTER TABLE jobs ALTER COLUMN state SET STATISTICS 0;

-- Forget statistics gathered before. Only a superuser may; where the migrating role is not
-- one, ask an administrator to run this DELETE once (ANALYZE no longer refreshes them).
DO $$
BEGIN
    DELETE FROM pg_statistic
    WHERE starelid = 'jobs'::regclass
      AND staattnum = (SELECT attnum FROM pg_attribute
                       WHERE attrelid = 'jobs'::regclass AND attname = 'state');
EXCEPTION WHEN insufficient_privilege THEN
    NULL;
END
$$;
