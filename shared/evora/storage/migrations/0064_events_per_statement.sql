-- Evora schema, version 64: the hot transitions write their events one row per statement
-- (docs/benchmarks/2026-11-30-events-per-statement.md). A claim of 100 jobs wrote 100
-- outbox rows, each a heap tuple with its header, a B-tree entry by (job_id, job_version,
-- at) and one by (xid, seq): ~1,460 B of WAL per job over its life, as much as `jobs` itself
-- (docs/benchmarks/2026-11-29-storage-shapes.md). Now such a statement writes one row of
-- `evora.event_batches`, every field of its events an array, which TOAST compresses.
--
-- What readers see does not change: `evora.job_events` becomes a view, one row per event,
-- over the rows written one by one (the table it was, renamed `job_event_rows`) and the
-- batches unfolded (as evora.batch_events(), functions/outbox.sql, does). The contract names
-- `job_events`; a view is what it allows.
--
-- seq: one sequence for both, the identity of the rows. A batch's writer takes a seq for each
-- of its events in their order (`seqs`) and keeps the first and the last (`seq`, `last_seq`)
-- for the indexes: seq stays unique and rising in the order the events were written. Other
-- statements may take seqs between a batch's (a batch's are not always consecutive), but not
-- those of its own transaction, whose statements run one after another: within a
-- transaction, its rows and batches hold disjoint ranges of seq, in the order they were
-- written.
--
-- The partitions: `event_batches` is partitioned by `at` as the rows are, with no default
-- partition, each partition the twin of the rows' partition of the same range
-- (evora.make_event_partitions() makes both; retention detaches and drops both). The twins of
-- the partitions that exist already are made by `evora migrate` right after this file, in
-- its transaction (evora.make_event_partitions()).
--
-- Indexes of a batch: (xid, last_seq) for the projector's span reader, which the rows have by
-- (xid, seq) (a batch holds an event past (xid, s) when its (xid, last_seq) is past it); BRIN
-- on (seq, last_seq) for the readers of ranges of seq (the audit, the archive): a batch holds
-- seqs of [lo, hi) only if seq < hi and last_seq >= lo; GIN on the job ids for a job's
-- timeline (`GET /v1/jobs/{id}/events`), the one reader by job.
--
-- Upgrade: nothing is rewritten; the events written before stay rows and leave with their
-- partitions. The previous release's services call the functions this release defines (they
-- write batches as soon as `evora migrate` ran) and read `job_events`, now the view: correct,
-- and its projector's reads of the tail by (xid, seq) read the batches' unfolded rows whole
-- until it is rolled (docs/deploy.md, Upgrades).
ALTER TABLE evora.job_events RENAME TO job_event_rows;

CREATE TABLE evora.event_batches (
    -- the events' seqs, rising (evora.next_seqs()); the first and the last kept apart for
    -- the indexes
    seqs bigint[] NOT NULL,
    seq bigint NOT NULL GENERATED ALWAYS AS (seqs[1]) STORED,
    last_seq bigint NOT NULL GENERATED ALWAYS AS (seqs[cardinality(seqs)]) STORED,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    at timestamptz NOT NULL,
    job_ids uuid[] NOT NULL,
    job_versions integer[] NOT NULL,
    queues text[] NOT NULL,
    types text[] NOT NULL,
    events text[] NOT NULL,
    from_states evora.job_state[] NOT NULL,
    to_states evora.job_state[] NOT NULL,
    attempts integer[] NOT NULL,
    worker_ids text[] NOT NULL,
    -- NULL: every event's data is {}
    data jsonb[],
    jobs evora.job_image[] NOT NULL,
    CONSTRAINT event_batches_size CHECK (cardinality(seqs) >= 1)
) PARTITION BY RANGE (at);

CREATE INDEX event_batches_tail ON evora.event_batches (xid, last_seq);
CREATE INDEX event_batches_seq ON evora.event_batches USING brin (seq, last_seq)
    WITH (pages_per_range = 32, autosummarize = on);
CREATE INDEX event_batches_jobs ON evora.event_batches USING gin (job_ids);

-- The text of these functions is functions/outbox.sql's; the writers (in function files
-- applied before that one) need them to exist.
CREATE FUNCTION evora.next_seqs(n bigint)
RETURNS bigint[]
LANGUAGE sql VOLATILE AS $$
    SELECT array_agg(s ORDER BY s)
    FROM (SELECT nextval('evora.job_events_seq_seq') AS s FROM generate_series(1, n)) t
$$;

-- The batches' half unfolds them as evora.batch_events() does, written out: a role let read
-- the view then needs no grant on a function.
CREATE VIEW evora.job_events AS
    SELECT r.seq, r.xid, r.job_id, r.job_version, r.queue, r.type, r.event, r.from_state,
           r.to_state, r.attempt, r.worker_id, r.at, r.data, r.job
    FROM evora.job_event_rows r
    UNION ALL
    SELECT e.seq, b.xid, e.job_id, e.job_version, e.queue, e.type, e.event, e.from_state,
           e.to_state, e.attempt, e.worker_id, b.at, coalesce(e.data, '{}'::jsonb), e.job
    FROM evora.event_batches b
    CROSS JOIN LATERAL (
        SELECT unnest(b.seqs) AS seq, unnest(b.job_ids) AS job_id,
               unnest(b.job_versions) AS job_version, unnest(b.queues) AS queue,
               unnest(b.types) AS type, unnest(b.events) AS event,
               unnest(b.from_states) AS from_state, unnest(b.to_states) AS to_state,
               unnest(b.attempts) AS attempt, unnest(b.worker_ids) AS worker_id,
               unnest(b.data) AS data, unnest(b.jobs) AS job) e;

-- Whoever an operator let read the table (a reporting role, a tool's) reads the view: the
-- table's grants, which stayed with it under its new name, are given on the view too.
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT a.grantee, a.privilege_type
        FROM pg_class c, aclexplode(c.relacl) a
        WHERE c.oid = 'evora.job_event_rows'::regclass AND a.grantee <> c.relowner
          AND a.privilege_type IN ('SELECT', 'INSERT')
    LOOP
        EXECUTE format('GRANT %s ON evora.job_events TO %s', g.privilege_type,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END);
    END LOOP;
END
$$;

-- A fair claim's tags (evora.claim_jobs()) and a scheduled job's schedule and tick
-- (evora.store_submissions()) are written by the statements into their batches: no row of a
-- `claimed` or a `submitted` event is written any more for the triggers that added them.
DROP TRIGGER IF EXISTS job_events_fair_tag ON evora.job_event_rows;
DROP FUNCTION IF EXISTS evora.add_fair_tag();
DROP TRIGGER IF EXISTS job_events_submitted_data ON evora.job_event_rows;
DROP FUNCTION IF EXISTS evora.add_submitted_data();
-- The function file that held the second (functions/schedules.sql) is gone with it: its
-- record goes too, or `evora migrate --check` would take it for a newer release's.
DO $$
BEGIN
    IF to_regclass('evora.function_files') IS NOT NULL THEN
        DELETE FROM evora.function_files WHERE name = 'schedules';
    END IF;
END
$$;
