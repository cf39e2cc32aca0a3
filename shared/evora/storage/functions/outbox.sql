-- The outbox (docs/architecture.md, rule 5): how its events are stored and read back.
--
-- The current text of this area's functions and triggers: edit them here. `evora migrate`
-- runs the file again whole, so every statement is re-runnable (CONTRIBUTING.md says how).
--
-- An event lives in one of two tables (migration 0064): `job_event_rows`, one row per event,
-- written by the transitions that move a job or a few; `event_batches`, one row per statement
-- of the hot transitions (claims, completions, evora.record_moves()), each field of its
-- events an array, their seqs too (evora.next_seqs()). `job_events` is the view that shows both as one row per event. Readers
-- that filter by seq or by job read through the functions below, which reach each table
-- through its own index: the view computes a batch's seqs and unfolds its job ids, so
-- neither filter reaches an index through it.

-- A batch's events, one row each, in the order they were written: for the readers below. The
-- view `job_events` (migration 0064) unfolds a batch with the same select list written out,
-- so that a role let read the view needs no grant on a function (nothing in the schema is
-- PUBLIC's); tests/integration/test_event_batches.py checks that the two agree.
CREATE OR REPLACE FUNCTION evora.batch_events(b evora.event_batches)
RETURNS SETOF evora.job_event_rows
LANGUAGE sql IMMUTABLE AS $$
    SELECT e.seq, b.xid, e.job_id, e.job_version, e.queue, e.type, e.event,
           e.from_state, e.to_state, e.attempt, e.worker_id, b.at,
           coalesce(e.data, '{}'::jsonb), e.job
    -- in the select list, where the arrays are read in step (an array shorter than the
    -- others, `data` NULL, gives NULLs) and the images stay whole (unnest() in FROM would
    -- spread each into its fields)
    FROM (SELECT unnest(b.seqs) AS seq, unnest(b.job_ids) AS job_id, unnest(b.job_versions) AS job_version,
                 unnest(b.queues) AS queue, unnest(b.types) AS type, unnest(b.events) AS event,
                 unnest(b.from_states) AS from_state, unnest(b.to_states) AS to_state,
                 unnest(b.attempts) AS attempt, unnest(b.worker_ids) AS worker_id,
                 unnest(b.data) AS data, unnest(b.jobs) AS job) e
$$;

-- `n` seqs of the outbox's sequence (the rows' identity) for a batch's events, rising: the
-- writer pairs them with its events in their order. Taken one by one (a sequence hands out
-- no range at once), so other transactions' may fall between them, never the writer's own.
CREATE OR REPLACE FUNCTION evora.next_seqs(n bigint)
RETURNS bigint[]
LANGUAGE sql VOLATILE AS $$
    SELECT array_agg(s ORDER BY s)
    FROM (SELECT nextval('evora.job_events_seq_seq') AS s FROM generate_series(1, n)) t
$$;

-- The events of seqs [lo, hi), in no order: the rows of that range, and the events of that
-- range in the batches that hold any (the BRIN indexes on seq, migrations 0059 and 0064).
-- Plain SQL without SET clauses, so a caller's query inlines it and plans it with the
-- caller's bounds.
CREATE OR REPLACE FUNCTION evora.events_between(lo bigint, hi bigint)
RETURNS SETOF evora.job_event_rows
LANGUAGE sql STABLE AS $$
    SELECT * FROM evora.job_event_rows r WHERE r.seq >= lo AND r.seq < hi
    UNION ALL
    SELECT e.* FROM evora.event_batches b CROSS JOIN LATERAL evora.batch_events(b) e
    WHERE b.seq < hi AND b.last_seq >= lo AND e.seq >= lo AND e.seq < hi
$$;

-- evora.events_between() for the auditor's walk (sql/audit.sql) and the archive, planned
-- with its bounds and never as a sequential scan: the planner's estimate of a BRIN scan of a
-- partition that holds none of the range can exceed that of reading the partition whole,
-- which it then does.
CREATE OR REPLACE FUNCTION evora.events_in_seq_range(lo bigint, hi bigint)
RETURNS SETOF evora.job_event_rows
LANGUAGE sql STABLE SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
    SELECT * FROM evora.events_between(lo, hi)
$$;

-- The milliseconds of `ids`' creation, each once per run of ids that share it: the keys of a
-- batch in event_batches_job_times (migration 0066), the index a job's timeline is found by
-- (GIN keeps each key of a row once whatever the array repeats). A job id
-- is a UUIDv7 whose first 6 bytes are its creation's Unix time in milliseconds
-- (evora.uuid7(), uuid7s() in storage/submissions.py), and the jobs a statement moves were
-- mostly created together (a batch submitted in one call shares one millisecond; a claim takes
-- the oldest first), so a batch of 100 events adds one key or a few to the index where one per
-- job cost ~110 B of WAL per event. An id of another kind (from before ids were UUIDv7s) is a
-- key of its own, as every id was. IMMUTABLE because an index is built on it: changing what
-- it returns requires rebuilding event_batches_job_times. PL/pgSQL, a loop over the array:
-- the index evaluates it in every statement that writes a batch, and a SQL function's body
-- (ARRAY(SELECT ... FROM unnest(ids))) is planned again in each before PostgreSQL 18, which
-- made a one-job batch's insert about three times as dear
-- (docs/benchmarks/2026-12-01-timeline-index.md).
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

-- A job's events, in no order: its rows through job_events_version_once, its batches through
-- event_batches_job_times (the batches holding a job created in its millisecond), of which
-- `job_ids @> ARRAY[id]` keeps those that hold it before any is unfolded. That second
-- condition is also the index of the batches' job ids by which the timeline was read before
-- migration 0066, which the upgrade keeps until the new index is built on every partition
-- (storage/migrate.py): whichever a partition has, its batches are read through an index.
-- Never a sequential scan, and planned with the id: a plan a connection kept from when a
-- partition held a few batches read every batch of it on each later call
-- (tests/integration/test_plan_traps.py, `events`).
CREATE OR REPLACE FUNCTION evora.events_of_job(id uuid)
RETURNS SETOF evora.job_event_rows
LANGUAGE sql STABLE SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
    SELECT * FROM evora.job_event_rows r WHERE r.job_id = id
    UNION ALL
    SELECT e.* FROM evora.event_batches b CROSS JOIN LATERAL evora.batch_events(b) e
    WHERE evora.job_id_times(b.job_ids) @> evora.job_id_times(ARRAY[id])
      AND b.job_ids @> ARRAY[id] AND e.job_id = id
$$;

-- The newest event's seq the caller's snapshot sees (0 without events). There is no B-tree
-- on seq (migration 0059), and max(seq) through its BRIN index reads every partition whole.
-- The identity's last value bounds it from above (a visible event's seq was taken before
-- the snapshot, and this reads the sequence after it): ranges of seq are read down from
-- there, each twice as wide as the one before, until one holds a visible event. One range but after a run of seqs taken by transactions that rolled back or
-- are still open. Each range is planned with its bounds (a generic plan, PL/pgSQL's after
-- five calls, reads the tail index for any range), and never as a sequential scan (one that
-- stops at the first event of a range is cheap, but a range estimated full and empty in fact
-- reads the partition whole).
CREATE OR REPLACE FUNCTION evora.last_event_seq()
RETURNS bigint
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
DECLARE
    hi    bigint := coalesce(
        pg_sequence_last_value(pg_get_serial_sequence('evora.job_event_rows', 'seq')::regclass),
        0);
    width bigint := 1024;
    found bigint;
BEGIN
    WHILE hi > 0 LOOP
        SELECT max(e.seq) INTO found FROM evora.events_between(hi - width + 1, hi + 1) e;
        IF found IS NOT NULL THEN
            RETURN found;
        END IF;
        hi := hi - width;
        width := width * 2;
    END LOOP;
    RETURN 0;
END
$$;

-- The first event's seq at or past `from_seq` that the caller's snapshot sees (NULL: none),
-- for a walk in seq order over a gap (the partitions retention dropped, seqs of transactions
-- that rolled back) without a B-tree on seq. Ranges twice as wide each time find one that
-- holds an event (any event of it: the read stops at the first); halving the span below it
-- then narrows down to the first, so that the range whose minimum is read at the end is at
-- most 1,024 seqs wide however many events lie past it. Planned as evora.last_event_seq().
CREATE OR REPLACE FUNCTION evora.first_event_seq(from_seq bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
DECLARE
    last  bigint := coalesce(
        pg_sequence_last_value(pg_get_serial_sequence('evora.job_event_rows', 'seq')::regclass),
        0);
    lo    bigint := greatest(from_seq, 1);
    width bigint := 1024;
    hit   bigint;
    mid   bigint;
BEGIN
    WHILE hit IS NULL AND lo <= last LOOP
        SELECT e.seq INTO hit FROM evora.events_between(lo, lo + width) e LIMIT 1;
        IF hit IS NULL THEN
            lo := lo + width;
            width := width * 2;
        END IF;
    END LOOP;
    IF hit IS NULL THEN
        RETURN NULL;
    END IF;
    -- the first is in [lo, hit]
    WHILE hit - lo > 1024 LOOP
        mid := lo + (hit - lo) / 2;
        SELECT coalesce(min(e.seq), hit) INTO hit FROM (
            SELECT e.seq FROM evora.events_between(lo, mid) e LIMIT 1) e;
        IF hit >= mid THEN
            lo := mid;
        END IF;
    END LOOP;
    RETURN (SELECT min(e.seq) FROM evora.events_between(lo, hit + 1) e);
END
$$;

-- The outbox is append-only: no UPDATE, DELETE or TRUNCATE of its rows or its batches.
-- Retention removes whole partitions (DETACH, then DROP: evora.expired_event_tables(),
-- retention.sql), the one removal there is. Row triggers, so that every partition has them
-- too (a statement trigger on the parent does not fire for a statement on a partition); the
-- first UPDATE or DELETE of a row rejects the statement. TRUNCATE has no row trigger: the
-- parent's rejects it, and truncating one partition is removing it whole.
CREATE OR REPLACE FUNCTION evora.reject_event_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'job_events is append-only (% rejected)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

-- The view answers as the table it was: an UPDATE or DELETE of an event is rejected as above
-- (a view of a UNION would refuse it with an error of its own), an INSERT is written as a row.
CREATE OR REPLACE FUNCTION evora.insert_event_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO evora.job_event_rows (job_id, job_version, queue, type, event, from_state,
                                      to_state, attempt, worker_id, at, data, job)
    VALUES (NEW.job_id, NEW.job_version, NEW.queue, NEW.type, NEW.event, NEW.from_state,
            NEW.to_state, NEW.attempt, NEW.worker_id, NEW.at, coalesce(NEW.data, '{}'),
            NEW.job)
    RETURNING seq, xid, data INTO NEW.seq, NEW.xid, NEW.data;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER job_events_insert
    INSTEAD OF INSERT ON evora.job_events
    FOR EACH ROW EXECUTE FUNCTION evora.insert_event_row();

CREATE OR REPLACE TRIGGER job_events_view_append_only
    INSTEAD OF UPDATE OR DELETE ON evora.job_events
    FOR EACH ROW EXECUTE FUNCTION evora.reject_event_change();

CREATE OR REPLACE TRIGGER job_events_append_only
    BEFORE UPDATE OR DELETE ON evora.job_event_rows
    FOR EACH ROW EXECUTE FUNCTION evora.reject_event_change();

CREATE OR REPLACE TRIGGER job_events_no_truncate
    BEFORE TRUNCATE ON evora.job_event_rows
    FOR EACH STATEMENT EXECUTE FUNCTION evora.reject_event_change();

CREATE OR REPLACE TRIGGER event_batches_append_only
    BEFORE UPDATE OR DELETE ON evora.event_batches
    FOR EACH ROW EXECUTE FUNCTION evora.reject_event_change();

CREATE OR REPLACE TRIGGER event_batches_no_truncate
    BEFORE TRUNCATE ON evora.event_batches
    FOR EACH STATEMENT EXECUTE FUNCTION evora.reject_event_change();
