-- Evora schema, version 53: a job submitted to run now enters one index by due time, not two
-- (docs/benchmarks/2026-11-29-pending-index-heartbeats-finished-jobs.md). jobs_scheduled, on
-- (queue, run_at) WHERE state = 'PENDING', held the same rows as jobs_claimable (queue,
-- priority, run_at, submit_seq) WHERE state = 'PENDING': every submission wrote an entry into
-- both, for the dispatcher's next due time (`next_due`, sql/jobs.sql) and the projector's
-- oldest due job (`oldest_due`, sql/outbox.sql) alone.
--
-- jobs_delayed keeps only the PENDING jobs due later than they were submitted
-- (`run_at > created_at`): those submitted with a delay or a run time ahead, retries after
-- their backoff, jobs released or resumed later. A job due in the future is always one of
-- them (run_at > now >= created_at), so `next_due` reads it as it read jobs_scheduled, one
-- probe per queue, and a job submitted to run now (run_at = created_at, both
-- evora.clock_now() of the submitting transaction) enters no index for it. `oldest_due` reads
-- jobs_claimable a priority at a time (evora.pending_priorities(),
-- functions/claims_and_transitions.sql). Dropping jobs_claimable's twin outright was measured
-- too: `next_due` through jobs_claimable grows with the priorities a queue's PENDING jobs have
-- (0.14 ms with 5, 0.8-2 ms with 100, against 0.05-0.1 ms), and the dispatcher asks it up to
-- every 50 ms per busy queue.
--
-- The previous release's `next_due` has no `run_at > created_at`, so during a rolling upgrade
-- it reads jobs_claimable with the due time as a filter (5.4 ms, 292 buffers on a queue of
-- 90,000 PENDING jobs); its `oldest_due` likewise. Building the index locks `jobs` against
-- writes for as long as it takes (docs/deploy.md, Upgrades).
DROP INDEX evora.jobs_scheduled;
CREATE INDEX jobs_delayed ON evora.jobs (queue, run_at)
    WHERE state = 'PENDING' AND run_at > created_at;
