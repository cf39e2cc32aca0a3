-- Evora schema, version 32: job_events is partitioned by time (`at`), so that retention
-- removes whole old partitions (DETACH ... CONCURRENTLY, then DROP) instead of deleting rows
-- one by one: no dead tuples, no vacuum debt, and a deployment that runs no archive still
-- has bounded history (docs/deploy.md, Retention). There is no default partition: it would
-- make DETACH CONCURRENTLY impossible. The sweeper and `evora migrate` create the partitions ahead
-- (evora.make_event_partitions(), functions/retention.sql).
--
-- The existing table becomes the first partition, [MINVALUE, the next minute), as it is:
-- a CHECK constraint proven by one sequential scan lets ATTACH skip its own, and the rows are
-- never copied. Its tail index (xid, seq) is taken over by the parent's as it is; the two
-- unique indexes are built anew, since a partitioned unique index must hold the partition key.
--
-- What enforces what now (docs/architecture.md, rule 2):
-- * seq: one identity sequence for the whole table, GENERATED ALWAYS, so unique and increasing
--   whatever the partition; the primary key (seq, at) is unique per partition.
-- * one event per job version: every event is written by the statement that moves its job
--   row to that version under the row's lock (record_moves, end_attempts, ...), so no two
--   writers can give a version twice; UNIQUE (job_id, job_version, at) still catches a
--   duplicate inside a partition, and the audit's chain_continuous check catches any.
-- * append-only: the triggers on the parent (functions/guards.sql), row triggers that every
--   partition inherits; removing a whole partition is the one removal there is.
DO $$
DECLARE
    next_seq bigint;
    -- The first partition ends at the next minute of Evora's clock; `evora migrate` makes
    -- the partitions after it (of EVORA_EVENT_PARTITION_SECONDS, the first one up to the
    -- next multiple of that) in this same transaction, before anyone can write an event.
    bound timestamptz := date_trunc('minute', evora.clock_now()) + interval '1 minute';
BEGIN
    SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END INTO next_seq
    FROM evora.job_events_seq_seq s;

    -- The triggers go on the parent (the function files create them after this migration).
    DROP TRIGGER job_events_append_only ON evora.job_events;
    DROP TRIGGER job_events_no_truncate ON evora.job_events;
    DROP TRIGGER job_events_delete_archived_only ON evora.job_events;
    DROP TRIGGER job_events_submitted_data ON evora.job_events;

    ALTER TABLE evora.job_events RENAME TO job_events_pinitial;
    ALTER INDEX evora.job_events_tail RENAME TO job_events_pinitial_xid_seq_idx;
    ALTER TABLE evora.job_events_pinitial DROP CONSTRAINT job_events_pkey;
    ALTER TABLE evora.job_events_pinitial DROP CONSTRAINT job_events_version_once;
    -- Drops the old sequence; the parent's takes over where it stopped.
    ALTER TABLE evora.job_events_pinitial ALTER COLUMN seq DROP IDENTITY;
    EXECUTE format('ALTER TABLE evora.job_events_pinitial ADD CONSTRAINT job_events_pinitial_range'
                   ' CHECK (at < %L)', bound);

    CREATE TABLE evora.job_events (
        seq bigint GENERATED ALWAYS AS IDENTITY,
        xid xid8 DEFAULT pg_current_xact_id() NOT NULL,
        job_id uuid NOT NULL,
        job_version integer NOT NULL,
        queue text NOT NULL,
        type text NOT NULL,
        event text NOT NULL,
        from_state evora.job_state,
        to_state evora.job_state NOT NULL,
        attempt integer NOT NULL,
        worker_id text,
        at timestamp with time zone NOT NULL,
        data jsonb DEFAULT '{}'::jsonb NOT NULL,
        job evora.job_image NOT NULL,
        CONSTRAINT job_events_pkey PRIMARY KEY (seq, at),
        CONSTRAINT job_events_version_once UNIQUE (job_id, job_version, at)
    ) PARTITION BY RANGE (at);
    CREATE INDEX job_events_tail ON evora.job_events (xid, seq);
    EXECUTE format('ALTER TABLE evora.job_events ALTER COLUMN seq RESTART WITH %s', next_seq);

    EXECUTE format('ALTER TABLE evora.job_events ATTACH PARTITION evora.job_events_pinitial'
                   ' FOR VALUES FROM (MINVALUE) TO (%L)', bound);
    ALTER TABLE evora.job_events_pinitial DROP CONSTRAINT job_events_pinitial_range;
END
$$;

-- An event is dated by its job's updated_at, and its partition chosen by that: a new job's
-- is on Evora's clock like every later one's (the same as now() but in tests, which run the
-- clock ahead), so that every event lands where the partitions made ahead of it are.
ALTER TABLE evora.jobs ALTER COLUMN created_at SET DEFAULT evora.clock_now(),
                       ALTER COLUMN updated_at SET DEFAULT evora.clock_now();

-- The archive's row-by-row DELETE is gone, and with it its row guard.
DROP FUNCTION evora.reject_unarchived_delete();
