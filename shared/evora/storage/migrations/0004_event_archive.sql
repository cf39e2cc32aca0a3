-- Evora schema, version 4: the Parquet event archive, and the one way events may leave.
--
-- `evora pipeline archive` copies old events to Parquet and then records how far the archive
-- reaches. The archived set is a rectangle, not a seq prefix: sequence numbers commit out of
-- order (DESIGN rule 5), so "every event with seq <= N" is not a set that can be known
-- complete. "Every event with seq <= upto_seq AND xid < below_xid" is: below_xid never
-- exceeds the projector's consumed horizon, which is below pg_snapshot_xmin, so no
-- transaction that could still add an event to the rectangle is running, and later
-- transactions get larger xids. Both bounds only grow, so each archive run adds the
-- difference of two nested rectangles and their union is always the latest one.
--
-- job_events stays append-only for everything else. DELETE passes the statement trigger only
-- while `evora.drop_archived_events` is on, which evora_drop_archived_events() sets for the
-- length of its own DELETE; and a row trigger checks every deleted row against the watermark,
-- so even a session that sets the flag by hand can only remove events that are archived.

-- How far each projector generation has consumed the outbox: events with xid < this xid are
-- in its read models. Written by the projector after each checkpoint; the minimum over the
-- generations is what retention may treat as consumed. A generation that becomes active
-- deletes the rows of older ones (their read models are dropped too).
CREATE TABLE projector_progress (
    generation integer     PRIMARY KEY,
    xid        xid8        NOT NULL,
    seq        bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One row: the archived rectangle. Starts empty (nothing has seq <= 0).
CREATE TABLE event_archive_watermark (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    upto_seq   bigint      NOT NULL CHECK (upto_seq >= 0),
    below_xid  xid8        NOT NULL,
    archived   bigint      NOT NULL CHECK (archived >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO event_archive_watermark (upto_seq, below_xid, archived) VALUES (0, '0', 0);

-- Each committed archive run: what it added and the row counts it verified per date
-- partition. Parquet files carry the run id in their names; files of a run that is not here
-- were never committed (a run killed before its commit) and are removed by the next run.
CREATE TABLE event_archive_runs (
    run_id       text        PRIMARY KEY,
    from_seq     bigint      NOT NULL,
    upto_seq     bigint      NOT NULL,
    from_xid     xid8        NOT NULL,
    below_xid    xid8        NOT NULL,
    events       bigint      NOT NULL CHECK (events > 0),
    max_seq      bigint      NOT NULL,
    partitions   jsonb       NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now()
);

-- The statement guard of migration 0001, now letting through the archive's own DELETE.
CREATE OR REPLACE FUNCTION evora_reject_event_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('evora.drop_archived_events', true) = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'job_events is append-only (% rejected)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

CREATE FUNCTION evora_reject_unarchived_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM event_archive_watermark w
        WHERE OLD.seq <= w.upto_seq AND OLD.xid < w.below_xid
    ) THEN
        RAISE EXCEPTION 'event % is not archived and may not be deleted', OLD.seq
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN OLD;
END
$$;

-- Runs only for rows a DELETE that passed the statement guard is about to remove.
CREATE TRIGGER job_events_delete_archived_only
    BEFORE DELETE ON job_events
    FOR EACH ROW EXECUTE FUNCTION evora_reject_unarchived_delete();

-- The retention path: removes up to `max_rows` events, oldest seq first, that are archived
-- (inside the watermark), consumed by every projector generation that has recorded
-- progress, and older than `older_than_seconds`. Asking for more than the archive holds is
-- an error, not a silent clamp: the caller has the wrong watermark. Returns the rows removed.
CREATE FUNCTION evora_drop_archived_events(
    upto_seq bigint, older_than_seconds float8, max_rows integer
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    mark     event_archive_watermark;
    consumed xid8;
    removed  bigint;
BEGIN
    IF older_than_seconds IS NULL OR older_than_seconds < 0 OR max_rows IS NULL OR max_rows < 1 THEN
        RAISE EXCEPTION 'invalid retention arguments (older than %, at most % rows)',
            older_than_seconds, max_rows USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO STRICT mark FROM event_archive_watermark;
    IF upto_seq IS NULL OR upto_seq > mark.upto_seq THEN
        RAISE EXCEPTION 'refusing to drop events up to seq %: the archive reaches only seq %',
            upto_seq, mark.upto_seq USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- No recorded progress means nothing is known to be consumed.
    -- (ORDER BY rather than min(): xid8 has no min aggregate before PostgreSQL 16)
    SELECT p.xid INTO consumed FROM projector_progress p ORDER BY p.xid LIMIT 1;
    IF consumed IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM set_config('evora.drop_archived_events', 'on', true);
    WITH gone AS (
        DELETE FROM job_events
        WHERE seq IN (
            SELECT e.seq FROM job_events e
            WHERE e.seq <= upto_seq AND e.xid < mark.below_xid AND e.xid < consumed
              AND e.at < now() - make_interval(secs => older_than_seconds)
            ORDER BY e.seq
            LIMIT max_rows
        )
        RETURNING 1
    )
    SELECT count(*) INTO removed FROM gone;
    PERFORM set_config('evora.drop_archived_events', 'off', true);
    RETURN removed;
END
$$;
