-- Evora schema, version 57: which children a job's own spawn made (docs/jobs-that-wait.md,
-- "Cancelling a waiting job"). A job waiting for its children that is cancelled cancels
-- them too: they are its work. Only the children its spawn created, not the jobs a child's
-- idempotency key replayed (another job's, or one submitted on its own: shared, they run
-- on), which `depends_on` cannot tell apart. One row per (parent, child) the spawn created
-- (JobStore.spawn_children, statement record_children); read only by a cancel, by parent.
-- The rows go with the parent (the cascade of its pruning): a child finishes, and is pruned,
-- before the parent it was waited for by, and a row naming a pruned child reads as nothing.
CREATE TABLE evora.spawned_children (
    parent uuid NOT NULL REFERENCES evora.jobs (id) ON DELETE CASCADE,
    child uuid NOT NULL,
    PRIMARY KEY (parent, child)
);
