-- Evora schema, version 36: admission control (docs/flow-control.md, "Admission"). A limit
-- may bound how many jobs holding its key wait to run (PENDING or WAITING): `max_pending`.
-- A submission that would take a key over it is refused whole (HTTP 429 `queue_full`;
-- evora.submit raises SQLSTATE EV429).
--
-- The depth is not stored: the submission that would change it locks the key (a transaction
-- advisory lock, class 'EVAD', on the key's hash) and counts the key's PENDING and WAITING
-- jobs, at most max_pending + 1 of them, in a new snapshot (functions/submissions.sql,
-- evora.admit()). Every way out of PENDING or WAITING (claim, cancel, expiry, a failed
-- dependency) frees its room by changing the state, with no code and no hot row on those
-- paths: only submissions of a key that has a max_pending pay.
ALTER TABLE evora.flow_limits
    ADD COLUMN max_pending integer CONSTRAINT flow_limits_max_pending CHECK (max_pending >= 1);
-- the auditor's history (0028): the max_pending from then on too
ALTER TABLE evora.flow_limit_changes ADD COLUMN max_pending integer;

-- The PENDING and WAITING jobs holding a key, for that count (`queue:<q>` uses jobs_listing,
-- (queue, state)). Jobs without keys are not in it. Written straight into its tree, as
-- jobs_running_limit_keys is (0017): a pending list would be read whole by every count.
CREATE INDEX jobs_waiting_limit_keys ON evora.jobs USING gin (limit_keys)
    WITH (fastupdate = off)
    WHERE state IN ('PENDING', 'WAITING') AND limit_keys <> '{}';
