-- Evora schema, version 63: a FIFO group's exclusivity holds for SUSPENDED jobs by the unique
-- index, as for RUNNING ones.
--
-- A job suspended on a callback keeps its group (its run is not over; docs/callbacks.md), and
-- the claims' rule (group_turn, rules.sql) refuses a group holding one, but only under the
-- claim's snapshot. What settles a claim whose snapshot predates the group's last change is the
-- unique index jobs_group_running, and it held only RUNNING jobs: a claim picks the group's
-- head, meanwhile a new head is submitted, claimed and suspended (RUNNING -> SUSPENDED,
-- committed), and the first claim's move to RUNNING found the new head's RUNNING entry dead
-- (the row's newest version is SUSPENDED, in jobs_group_suspended, a plain index) and passed:
-- a group with a SUSPENDED and a RUNNING job (tests/integration/test_group_exclusive.py).
--
-- jobs_group_running now holds the RUNNING and the SUSPENDED grouped jobs, unique per
-- (queue, group_key), and replaces jobs_group_suspended: such a claim fails on it and the store
-- runs it again (storage/jobs.py), and group_turn probes one index once per candidate instead
-- of two. The predicate is `state IN ('RUNNING', 'SUSPENDED')`, which the rule states: it does
-- not imply `state = 'RUNNING'`, so no partial index of RUNNING jobs alone (jobs_running_lease,
-- ...) is usable where the rule stands, as it was for the old probe of `state = 'RUNNING'`
-- (a generic plan made on a small table walked every RUNNING job per grouped candidate:
-- tests/integration/test_plan_traps.py). The name stays, though it now says less than the
-- index holds: the previous release's claim, serving during a rolling upgrade, runs again on
-- a unique violation of the constraint by that name and would answer any other as an error.
--
-- An installation where the race already happened holds a group with two such jobs, on which
-- the unique index cannot be built. The migration then refuses, naming the groups and their
-- jobs, before it changes anything: which job should keep the group is the operator's call
-- (cancel one, or wait for the RUNNING one to end), then `evora migrate` runs again
-- (docs/deploy.md, Upgrades). The check runs under the SHARE lock the build takes anyway,
-- so no claim can make a new pair between the check and the build.
--
-- The new index is built under a name of its own before the old ones are dropped: the build
-- (a pass over the whole table) holds the SHARE lock, which lets reads of `jobs` go on, and the
-- drops' ACCESS EXCLUSIVE lock, which stops them too, is taken only after it, for the rest of
-- the transaction (the function files).
LOCK TABLE evora.jobs IN SHARE MODE;

DO $$
DECLARE
    pairs text;
BEGIN
    SELECT string_agg(format('queue %L group %L: %s', queue, group_key, jobs), '; '
                      ORDER BY queue, group_key)
    INTO pairs
    FROM (SELECT queue, group_key,
                 string_agg(format('%s %s', id, state), ', ' ORDER BY state, id) AS jobs
          FROM evora.jobs
          WHERE state IN ('RUNNING', 'SUSPENDED') AND group_key IS NOT NULL
          GROUP BY queue, group_key
          HAVING count(*) > 1) AS held;
    IF pairs IS NOT NULL THEN
        RAISE EXCEPTION 'migration 0063 needs at most one RUNNING or SUSPENDED job per FIFO '
                        'group; these groups hold more (a claim race of earlier releases): %. '
                        'Cancel all but one job of each, or wait for the RUNNING ones to end, '
                        'then run evora migrate again', pairs;
    END IF;
END $$;

CREATE UNIQUE INDEX jobs_group_held ON evora.jobs (queue, group_key)
    WHERE state IN ('RUNNING', 'SUSPENDED') AND group_key IS NOT NULL;
DROP INDEX IF EXISTS evora.jobs_group_running;
DROP INDEX IF EXISTS evora.jobs_group_suspended;
ALTER INDEX evora.jobs_group_held RENAME TO jobs_group_running;
