-- Evora schema, version 65: every array of an evora.event_batches row holds one element per
-- event (as many as `seqs`), and `data` is NULL or does too.
--
-- The writers build every array of a row from the same rows, so no row breaks this; but the
-- view's unfolding would turn a short array into NULL fields, which readers take for the
-- event's own. The constraint makes a writer's mistake an error at its INSERT instead.
--
-- Adding it scans every batch. Added NOT VALID first, and committed (it holds the table's
-- ACCESS EXCLUSIVE lock only for that moment, and binds every row inserted from then on);
-- then validated in the migration's transaction, under SHARE UPDATE EXCLUSIVE, which lets
-- the previous release's writers go on inserting meanwhile. The first part runs again in the
-- transaction (the runner runs the whole file there): it finds the constraint and does
-- nothing.

DO $$
BEGIN
    IF NOT EXISTS (
        SELECT FROM pg_constraint
        WHERE conrelid = 'evora.event_batches'::regclass AND conname = 'event_batches_shape'
    ) THEN
        ALTER TABLE evora.event_batches ADD CONSTRAINT event_batches_shape CHECK (
            cardinality(job_ids) = cardinality(seqs)
            AND cardinality(job_versions) = cardinality(seqs)
            AND cardinality(queues) = cardinality(seqs)
            AND cardinality(types) = cardinality(seqs)
            AND cardinality(events) = cardinality(seqs)
            AND cardinality(from_states) = cardinality(seqs)
            AND cardinality(to_states) = cardinality(seqs)
            AND cardinality(attempts) = cardinality(seqs)
            AND cardinality(worker_ids) = cardinality(seqs)
            AND (data IS NULL OR cardinality(data) = cardinality(seqs))
            AND cardinality(jobs) = cardinality(seqs)
        ) NOT VALID;
    END IF;
END
$$;

-- evora:commit

ALTER TABLE evora.event_batches VALIDATE CONSTRAINT event_batches_shape;
