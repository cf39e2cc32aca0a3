-- Evora schema, version 2: accounting for retention.
--
-- The sweeper deletes finished jobs once they are old enough, and a deleted row writes no
-- event. The read models keep per-queue counts per state that must equal the true counts in
-- `jobs`, so every prune statement adds what it removed here, in the same statement as the
-- DELETE: true count = counts derived from events - pruned.

CREATE TABLE job_prune_counts (
    queue  text      NOT NULL,
    state  job_state NOT NULL,
    pruned bigint    NOT NULL CHECK (pruned >= 0),
    PRIMARY KEY (queue, state),
    -- only finished jobs can be deleted (a trigger on jobs rejects the others)
    CONSTRAINT job_prune_counts_finished_only CHECK (state IN ('COMPLETED', 'CANCELLED', 'DLQ'))
);
