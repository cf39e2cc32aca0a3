-- Retention (docs/deploy.md, Retention): pruning finished jobs, and job_events' partitions: made ahead
-- of the clock, dropped whole once expired.
--
-- The current text of this area's functions and triggers: edit them here. `evora migrate`
-- runs the file again whole, so every statement is re-runnable (CONTRIBUTING.md says how).

-- The previous release's sweeper calls this while it is rolled (docs/deploy.md, Upgrades).
-- Events no longer leave job_events row by row: whole partitions go (below). It removes
-- nothing; remove it a release after migration 0032.
CREATE OR REPLACE FUNCTION evora.drop_archived_events(
    upto_seq bigint, older_than_seconds float8, max_rows integer
) RETURNS bigint
LANGUAGE sql SECURITY DEFINER SET search_path = evora, pg_temp AS $$
    SELECT 0::bigint
$$;

-- The partitions of job_events (migration 0032), oldest first, with the range each holds
-- (`lower` NULL for the first one's MINVALUE) and whether a DETACH ... CONCURRENTLY of it
-- was interrupted (it must be finished with FINALIZE).
CREATE OR REPLACE FUNCTION evora.event_partitions()
RETURNS TABLE (name text, lower timestamptz, upper timestamptz, detach_pending boolean)
LANGUAGE sql STABLE AS $$
    SELECT c.relname::text,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''([^'']+)''\)')::timestamptz,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)')::timestamptz,
           i.inhdetachpending
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'evora.job_events'::regclass
    ORDER BY 3
$$;

-- The newest event's seq the caller's snapshot sees (0 without events). There is no B-tree
-- on seq (migration 0059), and max(seq) through its BRIN index reads every partition whole.
-- The identity's last value bounds it from above (a visible event's seq was taken before the
-- snapshot, and this reads the sequence after it): ranges of seq are read down from there,
-- each twice as wide as the one before, until one holds a visible event. One range but after
-- a run of seqs taken by transactions that rolled back or are still open. Each range is
-- planned with its bounds (a generic plan, PL/pgSQL's after five calls, reads the tail
-- index for any range), and never as a sequential scan (one that stops at the first event of
-- a range is cheap, but a range estimated full and empty in fact reads the partition whole).
CREATE OR REPLACE FUNCTION evora.last_event_seq()
RETURNS bigint
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
DECLARE
    hi    bigint := coalesce(
        pg_sequence_last_value(pg_get_serial_sequence('evora.job_events', 'seq')::regclass), 0);
    width bigint := 1024;
    found bigint;
BEGIN
    WHILE hi > 0 LOOP
        SELECT max(e.seq) INTO found FROM evora.job_events e
        WHERE e.seq > hi - width AND e.seq <= hi;
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
        pg_sequence_last_value(pg_get_serial_sequence('evora.job_events', 'seq')::regclass), 0);
    lo    bigint := greatest(from_seq, 1);
    width bigint := 1024;
    hit   bigint;
    mid   bigint;
BEGIN
    WHILE hit IS NULL AND lo <= last LOOP
        SELECT e.seq INTO hit FROM evora.job_events e
        WHERE e.seq >= lo AND e.seq < lo + width LIMIT 1;
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
            SELECT e.seq FROM evora.job_events e WHERE e.seq >= lo AND e.seq < mid LIMIT 1) e;
        IF hit >= mid THEN
            lo := mid;
        END IF;
    END LOOP;
    RETURN (SELECT min(e.seq) FROM evora.job_events e WHERE e.seq >= lo AND e.seq <= hit);
END
$$;

-- The events of seqs [lo, hi), in no order: a range the BRIN index on seq (migration 0059)
-- answers, for the auditor's walk (sql/audit.sql). Planned with its bounds and never as a
-- sequential scan: the planner's estimate of a BRIN scan of a partition that holds none of
-- the range can exceed that of reading the partition whole, which it then does.
CREATE OR REPLACE FUNCTION evora.events_in_seq_range(lo bigint, hi bigint)
RETURNS SETOF evora.job_events
LANGUAGE sql STABLE SET plan_cache_mode = force_custom_plan SET enable_seqscan = off AS $$
    SELECT * FROM evora.job_events e WHERE e.seq >= lo AND e.seq < hi
$$;

-- Creates the partitions of job_events from the newest one's end (or from the current slot,
-- if the clock has passed it) until `ahead` partitions of `width` seconds lie beyond Evora's
-- clock, each aligned to a multiple of `width` since the epoch and named by the time it
-- starts (UTC): job_events_p20261129 at midnight, job_events_p20261129_143000 otherwise.
-- Returns how many seconds of partitions are left ahead of the clock: an event is written
-- at the clock's time, and one written where no partition is fails its transition, so the
-- sweeper alerts long before that (deploy/prometheus/alerts.yml).
-- A new partition is made on its own and then attached: ATTACH takes a SHARE UPDATE
-- EXCLUSIVE lock on the parent, which writers never wait for (CREATE TABLE ... PARTITION OF
-- would take an ACCESS EXCLUSIVE one). Two callers at once queue on that lock, the second
-- then finds the partitions made.
-- It also has the BRIN index on seq (migration 0059) summarize the last block range of each
-- partition the clock has passed: autosummarize summarizes a range when the next one starts
-- filling, so a partition's last one, partly filled, would stay unsummarized once writes
-- move on, and every read of a range of seq would read it whole in every such partition.
-- The current partition's is left to fill: an insert into a summarized range widens its
-- summary, a write of the index on the hot path. (A long transaction's event written into a
-- passed partition later does that, rarely.)
CREATE OR REPLACE FUNCTION evora.make_event_partitions(width float8, ahead integer)
RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
    target timestamptz;
    newest timestamptz;
    lo     timestamptz;
    hi     timestamptz;
    part   text;
    idx    regclass;
BEGIN
    IF width IS NULL OR width < 1 OR ahead IS NULL OR ahead < 1 THEN
        RAISE EXCEPTION 'invalid partitioning (% seconds, % ahead)', width, ahead
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    LOCK TABLE evora.job_events IN SHARE UPDATE EXCLUSIVE MODE;
    target := evora.clock_now() + make_interval(secs => width * ahead);
    SELECT max(p.upper) INTO newest FROM evora.event_partitions() p;
    lo := greatest(newest, to_timestamp(floor(extract(epoch FROM evora.clock_now()) / width) * width));
    WHILE lo < target LOOP
        hi := to_timestamp((floor(extract(epoch FROM lo) / width) + 1) * width);
        part := 'job_events_p' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD')
                || CASE WHEN lo = date_trunc('day', lo AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                        THEN '' ELSE to_char(lo AT TIME ZONE 'UTC', '_HH24MISS') END;
        EXECUTE format('CREATE TABLE evora.%I (LIKE evora.job_events INCLUDING DEFAULTS)', part);
        EXECUTE format('ALTER TABLE evora.job_events ATTACH PARTITION evora.%I FOR VALUES FROM (%L) TO (%L)',
                       part, lo, hi);
        lo := hi;
    END LOOP;
    FOR idx IN
        SELECT x.indexrelid::regclass
        FROM evora.event_partitions() p
        JOIN pg_index x ON x.indrelid = format('evora.%I', p.name)::regclass
        JOIN pg_inherits h ON h.inhrelid = x.indexrelid
        WHERE h.inhparent = 'evora.job_events_seq'::regclass
          AND p.upper <= evora.clock_now()
    LOOP
        PERFORM brin_summarize_new_values(idx);
    END LOOP;
    RETURN extract(epoch FROM greatest(lo, newest) - evora.clock_now());
END
$$;

-- The partitions of job_events retention may remove now, oldest first: every event in one
-- is older than `older_than` seconds (its whole range is), consumed by every projector
-- generation that recorded progress (its newest xid below each one's snapshot xmin; none
-- recorded: nothing is known to be consumed), and, with `archived_only`, inside the
-- archive's watermark. A transaction that began before a partition's end could still write
-- an event dated then, so a partition waits for every transaction older than its end.
-- `attached` is false for a table a round detached but could not drop: only DROP is left.
CREATE OR REPLACE FUNCTION evora.expired_event_partitions(older_than float8, archived_only boolean)
RETURNS TABLE (name text, attached boolean, detach_pending boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = evora, pg_temp AS $$
DECLARE
    part      record;
    consumed  xid8;
    mark      evora.event_archive_watermark;
    oldest    timestamptz;
    last_xid  xid8;
    past_mark boolean;
BEGIN
    IF older_than IS NULL OR older_than < 0 THEN
        RAISE EXCEPTION 'invalid retention (older than %)', older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
        SELECT c.relname::text, false, false FROM pg_class c
        WHERE c.relnamespace = 'evora'::regnamespace AND c.relkind = 'r'
          AND c.relname LIKE 'job\_events\_p%' AND NOT c.relispartition;
    -- (ORDER BY rather than min(): xid8 has no min aggregate before PostgreSQL 16)
    SELECT p.xid INTO consumed FROM evora.projector_progress p ORDER BY p.xid LIMIT 1;
    SELECT * INTO STRICT mark FROM evora.event_archive_watermark;
    -- The oldest other transaction's start, on Evora's clock (which may run ahead of now()).
    SELECT min(a.xact_start) + (evora.clock_now() - now()) INTO oldest
    FROM pg_stat_activity a WHERE a.xact_start IS NOT NULL AND a.pid <> pg_backend_pid();
    FOR part IN
        SELECT p.name, p.detach_pending FROM evora.event_partitions() p
        WHERE p.upper <= evora.clock_now() - make_interval(secs => older_than)
          AND (oldest IS NULL OR oldest >= p.upper)
        ORDER BY p.upper
    LOOP
        -- (NULL: the partition is empty) through job_events_tail
        EXECUTE format('SELECT e.xid FROM evora.%I e ORDER BY e.xid DESC LIMIT 1', part.name)
            INTO last_xid;
        -- whether it holds a seq past the archive's bound: not max(seq), which its BRIN
        -- index (migration 0059) answers only by reading the whole partition, but the ranges
        -- of seq past the bound, which an archived partition has none of
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM evora.%I e WHERE e.seq > $1)', part.name)
            INTO past_mark USING mark.upto_seq;
        IF last_xid IS NOT NULL AND NOT (
            last_xid < consumed
            AND (NOT archived_only OR (NOT past_mark AND last_xid < mark.below_xid))
        ) THEN
            -- A newer partition cannot go before this one: the archive and the projector
            -- read in order.
            EXIT;
        END IF;
        name := part.name;
        attached := true;
        detach_pending := part.detach_pending;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Removes the oldest jobs that finished in `finished` (COMPLETED, CANCELLED or DLQ) more
-- than `age` seconds ago, at most `batch` of them, and counts them in job_prune_counts (by
-- queue and state, in one order, so two passes at once cannot deadlock on the counters).
-- Returns how many were removed. A job that WAITING jobs depend on is kept.
CREATE OR REPLACE FUNCTION evora.prune_finished(age float8, batch integer, finished evora.job_state)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    held uuid[];
    removed bigint;
BEGIN
    -- The candidates, locked; rows others hold are skipped, never waited for. The literal
    -- list beside `state = finished` lets the planner prove that the jobs_finished partial
    -- index applies in a generic plan too. The dependents are asked here only to pass over
    -- the jobs already known to be kept, which would otherwise fill every batch.
    held := ARRAY(
        SELECT f.id FROM evora.jobs f
        WHERE f.state = finished AND f.state IN ('COMPLETED', 'CANCELLED', 'DLQ')
          AND f.finished_at < evora.clock_now() - make_interval(secs => age)
          AND NOT (f.has_dependents AND EXISTS (SELECT 1 FROM evora.waiting_dependents(f.id)))
        ORDER BY f.finished_at
        LIMIT batch
        FOR UPDATE SKIP LOCKED);
    -- A new statement, with a snapshot taken after the locks: the answer that counts.
    WITH gone AS (
        DELETE FROM evora.jobs f
        WHERE f.id = ANY(held)
          AND NOT (f.has_dependents AND EXISTS (SELECT 1 FROM evora.waiting_dependents(f.id)))
        RETURNING f.queue, f.state
    ),
    counted AS (
        INSERT INTO evora.job_prune_counts AS c (queue, state, pruned)
        SELECT g.queue, g.state, count(*) FROM gone g GROUP BY g.queue, g.state
        ORDER BY g.queue, g.state
        ON CONFLICT (queue, state) DO UPDATE SET pruned = c.pruned + excluded.pruned
    )
    SELECT count(*) INTO removed FROM gone;
    RETURN removed;
END
$$;

-- What a job leaves in other tables goes with it, whoever deletes it (evora.prune_finished(),
-- an operator's DELETE): its callbacks, the dependencies it waits on (job_dependencies by
-- job_id; the rows naming it as the dependency of others go with those others), its trace
-- context and the children it spawned. One statement per table for the whole DELETE, through
-- the statement's transition table; the foreign keys' ON DELETE CASCADE this replaces
-- (migration 0061) ran four queries for every deleted job.
-- Without the foreign keys, nothing refuses a row for a job that does not exist; none is
-- written for a job a DELETE may remove meanwhile. Retention deletes only finished jobs,
-- locked FOR UPDATE SKIP LOCKED, and every writer of these rows writes them for a job its own
-- transaction created (a submission's dependencies and trace context) or holds locked while
-- RUNNING (a callback: evora.suspend_job(); awaited children and their edges:
-- storage/sql/children.sql hold_parent), so a DELETE of that job waits for it or skips it,
-- and finds the job no longer finished, or its rows committed.
CREATE OR REPLACE FUNCTION evora.remove_job_references() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    ids uuid[];
BEGIN
    -- `= ANY` of an array: an index probe per id, whatever the plan cached for the first
    -- call thought of the transition table's size
    ids := ARRAY(SELECT g.id FROM gone g);
    IF ids = '{}' THEN
        RETURN NULL;
    END IF;
    DELETE FROM evora.callbacks c WHERE c.job_id = ANY(ids);
    DELETE FROM evora.job_dependencies d WHERE d.job_id = ANY(ids);
    DELETE FROM evora.job_traces t WHERE t.job_id = ANY(ids);
    DELETE FROM evora.spawned_children s WHERE s.parent = ANY(ids);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER jobs_references_removed
    AFTER DELETE ON evora.jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION evora.remove_job_references();

-- Removes at most `batch` rows of evora.submission_keys (migration 0056) that answer no later
-- submission, oldest first, and returns how many: throttle keys whose window has passed,
-- debounce keys whose job is no longer PENDING and never started, or is gone (the next
-- submission of such a key makes a new job, row or no row). A submission writes a key's row
-- under the key's advisory lock, not a row lock taken first, so the pass must not remove a
-- row a submission wrote after the pass read it:
--   * a throttle row is removed by its own `until`, which a locked row's newest version is
--     re-checked on (a submission that made a new job moved it forward);
--   * a debounce row's verdict is about another table: re-checked on a newest version, a
--     test of the job the row now names would read that job in the statement's snapshot,
--     where a job made after it is not, and "not PENDING" would remove the row naming it.
--     So the rows are read first, with the job each names, and locked in a statement of its
--     own only while they still name that job.
-- Rows others hold are skipped, never waited for (an application may keep a submission's
-- transaction open): they are looked at again next pass.
CREATE OR REPLACE FUNCTION evora.prune_submission_keys(batch integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    removed bigint;
    debounced bigint;
    queues text[];
    keys text[];
    jobs uuid[];
BEGIN
    WITH gone AS (
        DELETE FROM evora.submission_keys
        WHERE (queue, kind, key) IN (
            SELECT t.queue, t.kind, t.key FROM evora.submission_keys t
            WHERE t.kind = 'throttle' AND t.until <= evora.clock_now()
            ORDER BY t.until
            LIMIT batch
            FOR UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT count(*) INTO removed FROM gone;
    IF removed >= batch THEN
        RETURN removed;
    END IF;
    SELECT array_agg(d.queue), array_agg(d.key), array_agg(d.job_id) INTO queues, keys, jobs
    FROM (SELECT d.queue, d.key, d.job_id FROM evora.submission_keys d
          WHERE d.kind = 'debounce'
            -- One probe of the job's primary key per row, in the order of `since`, until the
            -- batch is found. (As a NOT EXISTS, an estimate of few PENDING jobs, stale after
            -- a burst, made it an anti-join rescanning every PENDING job for each key:
            -- 120,000 keys timed out.)
            AND (SELECT j.state = 'PENDING' AND j.started_at IS NULL
                 FROM evora.jobs j WHERE j.id = d.job_id) IS NOT TRUE
          ORDER BY d.since
          LIMIT batch - removed) AS d;
    -- A job that started, finished or went never becomes PENDING and unstarted again: a row
    -- still naming it is still prunable.
    WITH gone AS (
        DELETE FROM evora.submission_keys
        WHERE (queue, kind, key) IN (
            SELECT d.queue, d.kind, d.key FROM evora.submission_keys d
            WHERE d.kind = 'debounce'
              AND (d.queue, d.key, d.job_id) IN (SELECT * FROM unnest(queues, keys, jobs))
            FOR UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT count(*) INTO debounced FROM gone;
    RETURN removed + debounced;
END
$$;

-- Removes the rows of evora.flow_buckets (a key's token bucket, docs/flow-control.md) that
-- carry nothing, among the `batch` keys after `after` in key order (a walk of the primary
-- key: a pass reads every row once however few it removes, and no index is added that
-- every claim's update of a bucket would write too; docs/flow-control.md has the figures);
-- returns how many it removed and the last key it looked at (NULL: the walk reached the
-- end).
--
-- A missing row is made by the claim on first use as a full bucket: tokens = the governing
-- limit's rate_limit (0 without a rate, and a rate-less bucket's tokens are never read),
-- throttled_until NULL (evora.claim_limited()). So a row is equivalent to no row, and goes,
-- when it is not throttling (`throttled_until`, an upstream's drain, is past; while it holds,
-- evora.tokens() answers 0, whatever the limit) and
--   * its key's governing limit has a rate and the bucket is full by now: evora.tokens() at
--     the clock is the rate_limit (the same rule, and the same function, the claim counts
--     by; tokens only grow with time, so a later claim finds it full too), or
--   * that limit has no rate (its tokens are never read), or no limit governs the key any
--     more (no claim reads its bucket; one that comes to govern it starts from full).
-- The verdict is made on the locked row's newest version: the rows are locked FOR UPDATE
-- SKIP LOCKED and the test is on the locked row's own columns (rechecked on its newest
-- version when a claim committed a spend after this statement's snapshot). A claim holding
-- the row (it locks the row before it counts and keeps it until it commits) is skipped, never
-- waited for, and looked at again next pass; a row a claim is making (under the key's
-- advisory lock) is not visible yet. A claim whose snapshot still saw a row removed here finds
-- it gone when it locks it and leaves the key blocked for that claim, as if locked; the
-- next claim makes it anew, full, as the limit would have refilled it.
CREATE OR REPLACE FUNCTION evora.prune_flow_buckets(after text, batch integer)
RETURNS TABLE (pruned bigint, last_key text)
LANGUAGE plpgsql AS $$
DECLARE
    at CONSTANT timestamptz := evora.clock_now();
    keys text[];
BEGIN
    keys := ARRAY(SELECT b.key FROM evora.flow_buckets b WHERE b.key > after
                  ORDER BY b.key LIMIT batch);
    last_key := CASE WHEN cardinality(keys) = batch THEN keys[batch] END;
    WITH governing AS MATERIALIZED (
        SELECT * FROM evora.governing_limits(keys)
    ),
    gone AS (
        DELETE FROM evora.flow_buckets
        WHERE key IN (
            SELECT b.key FROM evora.flow_buckets b
            LEFT JOIN governing g ON g.key = b.key
            WHERE b.key = ANY(keys)
              AND (b.throttled_until IS NULL OR b.throttled_until <= at)
              AND (g.rate_limit IS NULL
                   OR evora.tokens(b, g.rate_limit, g.rate_per_seconds, at) >= g.rate_limit)
            FOR UPDATE OF b SKIP LOCKED)
        RETURNING 1
    )
    SELECT count(*) INTO pruned FROM gone;
    RETURN NEXT;
END
$$;
