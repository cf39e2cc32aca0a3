-- Rules that several statements and functions must state alike, where a function holding
-- them would cost the hot path: each is written here once, as an SQL expression over the
-- candidate job `j` (every place that uses a rule calls that job `j`), after a
-- `-- name: <rule>` line and ending with `;`. A statement (sql/*.sql) or a function file
-- (functions/*.sql) writes `{{rule:<rule>}}` where the rule applies; storage/statements.py
-- puts the rule's text there, in parentheses, when the statement is read, and `evora
-- migrate` before it runs a function file (whose checksum covers the rule, so a change
-- here runs the files that use it again). An unknown rule fails at once, and an unexpanded
-- marker is not SQL.

-- name: group_turn
-- FIFO groups: a grouped job may be claimed only as the head of its (queue, group) (lowest
-- priority, then submission order, due or not, so a retrying head keeps its place) and only
-- while no job of its group runs or is suspended on a callback (the group is ordered: the
-- suspended job's run is not over, and it comes back as the head; docs/callbacks.md). Used by both claims (`claim` in sql/transitions.sql and
-- evora.claim_limited()) and by the dispatcher's report of unclaimed jobs (`unclaimed_jobs`
-- in sql/jobs.sql). Not a function: called once per grouped candidate, it cost ~40 % more
-- PostgreSQL CPU on claims of grouped jobs (bench/store.py --quick --groups 1000, drain
-- phases), since a function with subqueries is never inlined.
-- The checks are scalar subqueries (`(SELECT true ... LIMIT 1) IS NULL`), not NOT
-- EXISTS: the planner may answer a NOT EXISTS for every group at once, with a hashed subplan
-- built from every RUNNING job of every queue (`state` keeps no statistics, so it expects a
-- few hundred), read in full by every claim. A scalar subquery is never hashed: each grouped
-- candidate probes jobs_group_running and jobs_group_pending by its own key, and a claim
-- costs the same however many jobs run elsewhere (tests/integration/test_claim_cost.py).
-- The first check states jobs_group_running's predicate as the index writes it (RUNNING and
-- SUSPENDED jobs, migration 0063): it implies no `state = 'RUNNING'`, so no other partial
-- index of RUNNING jobs is usable for it. The probe of `state = 'RUNNING'` it replaced was:
-- under a generic plan made while `jobs` held a few rows, it walked jobs_running_lease with
-- the group as a filter, every RUNNING job for each grouped candidate (208 rows to claim one
-- job beside 200 running: tests/integration/test_plan_traps.py). That index, unique, is also
-- what holds the group against a claim whose snapshot predates its last change.
j.group_key IS NULL OR (
    (SELECT true FROM evora.jobs r
     WHERE r.state IN ('RUNNING', 'SUSPENDED') AND r.queue = j.queue
       AND r.group_key = j.group_key
     LIMIT 1) IS NULL
    AND (SELECT true FROM evora.jobs e
         WHERE e.state = 'PENDING' AND e.queue = j.queue AND e.group_key = j.group_key
           AND (e.priority, e.submit_seq) < (j.priority, j.submit_seq)
         LIMIT 1) IS NULL);
