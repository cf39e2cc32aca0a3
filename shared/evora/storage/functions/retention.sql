-- Retention (docs/deploy.md, Retention): pruning finished jobs, and the outbox's partitions: made
-- ahead of the clock, dropped whole once expired.
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

-- Every partition of the outbox's two tables (migration 0064: the events written one by one,
-- `job_event_rows`, and those written a statement at a time, `event_batches`), oldest first,
-- each with its parent, the range it holds (`lower` NULL for the first one's MINVALUE) and
-- whether a DETACH ... CONCURRENTLY of it was interrupted (it must be finished with FINALIZE).
-- Both tables are partitioned alike: each partition of the rows has a twin of the same range
-- for the batches, named after it (evora.batch_partition()).
CREATE OR REPLACE FUNCTION evora.event_tables()
RETURNS TABLE (parent text, name text, lower timestamptz, upper timestamptz,
               detach_pending boolean)
LANGUAGE sql STABLE AS $$
    SELECT 'evora.' || p.relname, c.relname::text,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''([^'']+)''\)')::timestamptz,
           substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)')::timestamptz,
           i.inhdetachpending
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
    WHERE i.inhparent IN ('evora.job_event_rows'::regclass, 'evora.event_batches'::regclass)
    ORDER BY 4, 1
$$;

-- The partitions of the events written one by one (migration 0032), which set the ranges,
-- as evora.event_tables() gives them.
CREATE OR REPLACE FUNCTION evora.event_partitions()
RETURNS TABLE (name text, lower timestamptz, upper timestamptz, detach_pending boolean)
LANGUAGE sql STABLE AS $$
    SELECT t.name, t.lower, t.upper, t.detach_pending FROM evora.event_tables() t
    WHERE t.parent = 'evora.job_event_rows'
$$;

-- The name of the batches' partition that is the twin of the rows' partition `rows_partition`
-- (job_events_p20261129 -> event_batches_p20261129).
CREATE OR REPLACE FUNCTION evora.batch_partition(rows_partition text)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT 'event_batches_p' || substr(rows_partition, length('job_events_p') + 1)
$$;

-- Creates the partitions of job_events from the newest one's end (or from the current slot,
-- if the clock has passed it) until `ahead` partitions of `width` seconds lie beyond Evora's
-- clock, each aligned to a multiple of `width` since the epoch and named by the time it
-- starts (UTC): job_events_p20261129 at midnight, job_events_p20261129_143000 otherwise;
-- and the twin of every one that has none yet (evora.batch_partition(): the partitions made
-- before migration 0064 get theirs the first time).
-- Returns how many seconds of partitions are left ahead of the clock: an event is written
-- at the clock's time, and one written where no partition is fails its transition, so the
-- sweeper alerts long before that (deploy/prometheus/alerts.yml).
-- A new partition is made on its own and then attached: ATTACH takes a SHARE UPDATE
-- EXCLUSIVE lock on the parent, which writers never wait for (CREATE TABLE ... PARTITION OF
-- would take an ACCESS EXCLUSIVE one). Two callers at once queue on that lock, the second
-- then finds the partitions made.
-- It also has the BRIN indexes on seq (migrations 0059, 0064) summarize the last block range
-- of each partition the clock has passed: autosummarize summarizes a range when the next one
-- starts filling, so a partition's last one, partly filled, would stay unsummarized once
-- writes move on, and every read of a range of seq would read it whole in every such
-- partition. The current partition's is left to fill: an insert into a summarized range
-- widens its summary, a write of the index on the hot path. (A long transaction's event
-- written into a passed partition later does that, rarely.)
CREATE OR REPLACE FUNCTION evora.make_event_partitions(width float8, ahead integer)
RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
    target timestamptz;
    newest timestamptz;
    lo     timestamptz;
    hi     timestamptz;
    part   text;
    slot   record;
    idx    regclass;
BEGIN
    IF width IS NULL OR width < 1 OR ahead IS NULL OR ahead < 1 THEN
        RAISE EXCEPTION 'invalid partitioning (% seconds, % ahead)', width, ahead
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    LOCK TABLE evora.job_event_rows IN SHARE UPDATE EXCLUSIVE MODE;
    LOCK TABLE evora.event_batches IN SHARE UPDATE EXCLUSIVE MODE;
    target := evora.clock_now() + make_interval(secs => width * ahead);
    SELECT max(p.upper) INTO newest FROM evora.event_partitions() p;
    lo := greatest(newest, to_timestamp(floor(extract(epoch FROM evora.clock_now()) / width) * width));
    WHILE lo < target LOOP
        hi := to_timestamp((floor(extract(epoch FROM lo) / width) + 1) * width);
        part := 'job_events_p' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMMDD')
                || CASE WHEN lo = date_trunc('day', lo AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                        THEN '' ELSE to_char(lo AT TIME ZONE 'UTC', '_HH24MISS') END;
        EXECUTE format('CREATE TABLE evora.%I (LIKE evora.job_event_rows INCLUDING DEFAULTS)', part);
        EXECUTE format('ALTER TABLE evora.job_event_rows ATTACH PARTITION evora.%I FOR VALUES FROM (%L) TO (%L)',
                       part, lo, hi);
        lo := hi;
    END LOOP;
    FOR slot IN
        SELECT p.name, p.lower, p.upper FROM evora.event_partitions() p
        WHERE to_regclass(format('evora.%I', evora.batch_partition(p.name))) IS NULL
    LOOP
        part := evora.batch_partition(slot.name);
        EXECUTE format('CREATE TABLE evora.%I (LIKE evora.event_batches INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED)', part);
        EXECUTE format('ALTER TABLE evora.event_batches ATTACH PARTITION evora.%I FOR VALUES FROM (%s) TO (%L)',
                       part, coalesce(quote_literal(slot.lower), 'MINVALUE'), slot.upper);
    END LOOP;
    FOR idx IN
        SELECT x.indexrelid::regclass
        FROM evora.event_tables() p
        JOIN pg_index x ON x.indrelid = format('evora.%I', p.name)::regclass
        JOIN pg_inherits h ON h.inhrelid = x.indexrelid
        WHERE h.inhparent IN ('evora.job_events_seq'::regclass, 'evora.event_batches_seq'::regclass)
          AND p.upper <= evora.clock_now()
    LOOP
        PERFORM brin_summarize_new_values(idx);
    END LOOP;
    RETURN extract(epoch FROM greatest(lo, newest) - evora.clock_now());
END
$$;

-- The previous release's sweeper calls this while it is rolled (docs/deploy.md, Upgrades):
-- its DETACH names `job_events`, a view since migration 0064. It removes nothing; remove it
-- a release after migration 0064.
CREATE OR REPLACE FUNCTION evora.expired_event_partitions(older_than float8, archived_only boolean)
RETURNS TABLE (name text, attached boolean, detach_pending boolean)
LANGUAGE sql SECURITY DEFINER SET search_path = evora, pg_temp AS $$
    SELECT NULL::text, NULL::boolean, NULL::boolean WHERE false
$$;

-- The partitions of the outbox retention may remove now, oldest first, a range at a time
-- (the rows' partition and its twin for the batches): every event in one is older than
-- `older_than` seconds (its whole range is), consumed by every projector generation that
-- recorded progress (its newest xid below each one's snapshot xmin; none recorded: nothing is
-- known to be consumed), and, with `archived_only`, inside the archive's watermark. A
-- transaction that began before a partition's end could still write an event dated then, so
-- a partition waits for every transaction older than its end. `attached` is false for a
-- table a round detached but could not drop: only DROP is left.
CREATE OR REPLACE FUNCTION evora.expired_event_tables(older_than float8, archived_only boolean)
RETURNS TABLE (parent text, name text, attached boolean, detach_pending boolean)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = evora, pg_temp AS $$
DECLARE
    slot      record;
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
        SELECT CASE WHEN c.relname LIKE 'event\_batches\_p%' THEN 'evora.event_batches'
                    ELSE 'evora.job_event_rows' END,
               c.relname::text, false, false
        FROM pg_class c
        WHERE c.relnamespace = 'evora'::regnamespace AND c.relkind = 'r'
          AND (c.relname LIKE 'job\_events\_p%' OR c.relname LIKE 'event\_batches\_p%')
          AND NOT c.relispartition;
    -- (ORDER BY rather than min(): xid8 has no min aggregate before PostgreSQL 16)
    SELECT p.xid INTO consumed FROM evora.projector_progress p ORDER BY p.xid LIMIT 1;
    SELECT * INTO STRICT mark FROM evora.event_archive_watermark;
    -- The oldest other transaction's start, on Evora's clock (which may run ahead of now()).
    SELECT min(a.xact_start) + (evora.clock_now() - now()) INTO oldest
    FROM pg_stat_activity a WHERE a.xact_start IS NOT NULL AND a.pid <> pg_backend_pid();
    <<slots>>
    FOR slot IN
        SELECT p.upper FROM evora.event_tables() p
        WHERE p.upper <= evora.clock_now() - make_interval(secs => older_than)
          AND (oldest IS NULL OR oldest >= p.upper)
        GROUP BY p.upper
        ORDER BY p.upper
    LOOP
        FOR part IN SELECT p.parent, p.name FROM evora.event_tables() p WHERE p.upper = slot.upper LOOP
            -- (NULL: the partition is empty) through the tail index (xid, seq)
            EXECUTE format('SELECT e.xid FROM evora.%I e ORDER BY e.xid DESC LIMIT 1', part.name)
                INTO last_xid;
            -- whether it holds a seq past the archive's bound: not max(seq), which its BRIN
            -- index (migrations 0059, 0064) answers only by reading the whole partition, but
            -- the ranges of seq past the bound, which an archived partition has none of (a
            -- batch's last seq is its greatest)
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM evora.%I e WHERE e.%I > $1)', part.name,
                           CASE WHEN part.parent = 'evora.event_batches' THEN 'last_seq'
                                ELSE 'seq' END)
                INTO past_mark USING mark.upto_seq;
            IF last_xid IS NOT NULL AND NOT (
                coalesce(last_xid < consumed, false)  -- (no progress recorded: not consumed)
                AND (NOT archived_only OR (NOT past_mark AND last_xid < mark.below_xid))
            ) THEN
                -- A newer range cannot go before this one: the archive and the projector read
                -- in order.
                EXIT slots;
            END IF;
        END LOOP;
        RETURN QUERY
            SELECT p.parent, p.name, true, p.detach_pending FROM evora.event_tables() p
            WHERE p.upper = slot.upper;
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
