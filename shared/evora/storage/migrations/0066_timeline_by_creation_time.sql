-- Evora schema, version 66: a job's timeline finds its batches of events through the
-- milliseconds its jobs were created in, not through every job id.
--
-- event_batches_jobs, the GIN index of each batch's job ids (migration 0064), added an entry
-- per event: ~110 B of WAL each, about 390 B per job submitted, claimed and completed
-- (bench.drain_pg, 2026-12-01), for one reader, `GET /v1/jobs/{id}/events`
-- (evora.events_of_job()). event_batches_job_times indexes the distinct milliseconds of a
-- batch's job ids instead (evora.job_id_times(), functions/outbox.sql): the jobs a statement
-- moves were mostly created together, so a batch adds a key or a few. A job's timeline then
-- reads the batches that hold a job of its millisecond and keeps those that hold it.
--
-- Building an index on a partitioned table locks every partition against writes for the
-- build, and the partitions of a busy day's history are large. So the new index is made
-- ON ONLY the parent (no partition yet; a partition created from now on gets its own at
-- once), each partition of a few megabytes gets its own here and attached, and the larger
-- ones are built by `evora migrate` right after this transaction, CONCURRENTLY, one at a
-- time, then attached (storage/migrate.py). The old index is dropped once the new one is
-- valid: here, when every partition was small (a new installation), else by that step,
-- which evora.retiring_indexes tells what to drop. Until then the timeline reads each
-- partition through whichever of the two it has (evora.events_of_job()).

-- The text of this function is functions/outbox.sql's; the index needs it to exist.
CREATE OR REPLACE FUNCTION evora.job_id_times(ids uuid[])
RETURNS bytea[]
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    keys bytea[] := '{}';
    one  uuid;
    key  bytea;
    last bytea;
BEGIN
    FOREACH one IN ARRAY ids LOOP
        key := substring(uuid_send(one) FROM 1 FOR 6);
        IF key IS DISTINCT FROM last THEN
            keys := keys || key;
            last := key;
        END IF;
    END LOOP;
    RETURN keys;
END
$$;

-- Indexes a migration replaced, each dropped by `evora migrate` once its replacement (a
-- partitioned index, built partition by partition after the migration) is valid.
CREATE TABLE evora.retiring_indexes (
    name        text PRIMARY KEY,
    replaced_by text NOT NULL
);

CREATE INDEX event_batches_job_times ON ONLY evora.event_batches
    USING gin (evora.job_id_times(job_ids)) WITH (fastupdate = off);

DO $$
DECLARE
    part record;
    child text;
BEGIN
    FOR part IN
        SELECT c.oid::regclass AS rel, c.relname
        FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
        WHERE h.inhparent = 'evora.event_batches'::regclass
          AND pg_total_relation_size(c.oid) < 8 * 1024 * 1024
    LOOP
        child := left(part.relname, 30) || '_job_times';
        EXECUTE format('CREATE INDEX %I ON %s USING gin (evora.job_id_times(job_ids)) '
                       'WITH (fastupdate = off)', child, part.rel);
        EXECUTE format('ALTER INDEX evora.event_batches_job_times ATTACH PARTITION evora.%I',
                       child);
    END LOOP;
    IF (SELECT indisvalid FROM pg_index
        WHERE indexrelid = 'evora.event_batches_job_times'::regclass) THEN
        DROP INDEX evora.event_batches_jobs;
    ELSE
        INSERT INTO evora.retiring_indexes (name, replaced_by)
        VALUES ('event_batches_jobs', 'event_batches_job_times');
    END IF;
END
$$;
