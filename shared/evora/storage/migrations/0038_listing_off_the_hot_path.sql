-- Evora schema, version 38: a claim no longer enters the admin listing's index
-- (docs/benchmarks/2026-11-29-narrow-hot-path.md). A claim and a completion change `state`,
-- which the partial indexes' predicates name, so neither is ever a HOT update: each adds an
-- entry to every index of `jobs` whose predicate the new row matches. jobs_listing, on
-- (queue, state, submit_seq) and full, took one of each.
--
-- Now it leaves the RUNNING jobs out, so a claim adds nothing to it; the listing reads the
-- RUNNING jobs apart (through jobs_submit_seq, or jobs_running_lease when a filter on queue
-- or type makes every RUNNING job the shorter read) and merges them with the rest
-- (storage/queries.py, list_jobs). Redrive's DLQ batch and admission's count of a queue's
-- PENDING and WAITING jobs (evora.pending_holding()) read it as they read jobs_listing.
-- jobs_submit_seq stays, full: it pages the listing without a queue and the RUNNING jobs.
-- Leaving the RUNNING jobs out of it as well would save the claim one more entry, but every
-- page would then read every RUNNING job (measured with 1,000,000 jobs, 10,000 of them
-- RUNNING: 45-117 ms a page instead of under 1 ms).
--
-- The previous release's listing (every state at once) still answers during a rolling
-- upgrade, through jobs_submit_seq, as it does without a queue filter. Building the index
-- locks `jobs` against writes for as long as it takes (docs/deploy.md, Upgrades).
DROP INDEX evora.jobs_listing;
CREATE INDEX jobs_listing_at_rest ON evora.jobs (queue, state, submit_seq)
    WHERE state <> 'RUNNING';
