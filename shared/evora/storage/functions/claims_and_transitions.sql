-- Claims and transitions: the clock, how a job becomes RUNNING (the unlimited claim is
-- `claim` in storage/sql/transitions.sql, which calls evora.claim_jobs()), what every
-- transition records, how an attempt ends and how a job leaves the DLQ.
--
-- The current text of this area's functions and triggers: edit them here. `evora migrate`
-- runs the file again whole, so every statement is re-runnable (CONTRIBUTING.md says how).

-- One clock for every time-dependent statement: the database's own `now()` (the start of the
-- transaction), so PostgreSQL stays the only clock whatever the clocks of the machines running
-- the services say. A session may run it ahead by an interval in the `evora.clock_offset`
-- setting, which only tests set (per database, so every connection a test's services open sees
-- the same time), instead of rewriting deadlines behind the state machine's back. Unset, it
-- adds nothing. Plain SQL, STABLE and one expression, so the planner inlines it: a statement
-- evaluates `now() + offset` exactly as it evaluated `now()`, with no function call.
CREATE OR REPLACE FUNCTION evora.clock_now() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT now() + coalesce(nullif(current_setting('evora.clock_offset', true), '')::interval,
                            interval '0')
$$;

-- Retry n waits about initial * multiplier^(n-1), jittered by +-20 %, never above max.
-- Computed in log space so huge attempt counts cannot overflow. A NULL field is the default
-- (a job stores its defaults as NULL: migration 0067).
CREATE OR REPLACE FUNCTION evora.backoff_seconds(
    initial float8, max_seconds float8, multiplier float8, n integer
) RETURNS float8
LANGUAGE sql VOLATILE AS $$
    SELECT least(
        b.max_seconds,
        exp(least(ln(b.initial) + greatest(n - 1, 0) * ln(b.multiplier), ln(b.max_seconds) + 1))
            * (0.8 + 0.4 * random()))
    FROM (SELECT coalesce(initial, (d ->> 'initial_seconds')::float8) AS initial,
                 coalesce(max_seconds, (d ->> 'max_seconds')::float8) AS max_seconds,
                 coalesce(multiplier, (d ->> 'multiplier')::float8) AS multiplier
          FROM (SELECT evora.limits() -> 'backoff' AS d) AS defaults) AS b
$$;

-- The image of a job that its `submitted` event carries: everything a projection needs,
-- nothing large (no payload, result or progress); later events carry evora.event_image(). A plain SQL body, so the planner inlines it.
CREATE OR REPLACE FUNCTION evora.job_image(j evora.jobs) RETURNS evora.job_image
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(j.id, j.queue, j.type, j.state, j.priority, j.group_key, j.idempotency_key,
               j.attempt, j.max_attempts, j.lease_seconds, j.run_at, j.expires_at,
               j.lease_expires_at, j.worker_id, j.cancel_requested, j.last_error, j.version,
               j.submit_seq, j.created_at, j.updated_at, j.started_at, j.finished_at)::evora.job_image
$$;

-- The image an event after `submitted` carries: only what readers of the outbox take from an
-- event's image and the event's own columns do not say (the `submitted` event carries the
-- whole evora.job_image(), the job as submitted). The rest of the row image is NULL, which
-- costs a bit each in the row's null bitmap: a claim's or a completion's event is ~100 bytes
-- smaller than with the whole image (docs/benchmarks/2026-11-29-narrow-hot-path.md). What is
-- carried, and who reads it:
--   run_at      while the job waits or runs: the projector's wait of a claim is `at - run_at`
--               (storage/sql/outbox.sql), and a PENDING job's event says when it is due;
--   started_at  on an event to or from RUNNING: the projector's run time of a completion, and
--               the auditor's identity of an attempt (evora/storage/audit.py, with the
--               event's own attempt and worker_id columns);
--   group_key, priority, submit_seq
--               for a job of a FIFO group: the auditor's group order and exclusivity.
-- The id, state, version, queue, type, attempt and worker are the event's own columns. Events
-- written before this (whole images) carry all of it too, so every reader reads both.
CREATE OR REPLACE FUNCTION evora.event_image(j evora.jobs, from_state evora.job_state)
RETURNS evora.job_image
LANGUAGE sql IMMUTABLE AS $$
    SELECT ROW(NULL, NULL, NULL, NULL,
               CASE WHEN j.group_key IS NOT NULL THEN j.priority END, j.group_key, NULL,
               NULL, NULL, NULL,
               CASE WHEN j.state IN ('PENDING', 'RUNNING') THEN j.run_at END, NULL,
               NULL, NULL, NULL, NULL, NULL,
               CASE WHEN j.group_key IS NOT NULL THEN j.submit_seq END, NULL, NULL,
               CASE WHEN 'RUNNING' IN (j.state, from_state) THEN j.started_at END,
               NULL)::evora.job_image
$$;

-- Records `moves` (one event each) and sends the NOTIFY hint of every queue that gained a
-- claimable job, except those in `suppressed` (this process notified them a moment ago), which
-- it returns as owed (the hints and the fair claim's notes are evora.note_moves()'s). One row,
-- whatever it was given, which ROWS 1 tells the planner (it takes a set-returning PL/pgSQL
-- function for 1,000 rows, and the ack joining each of its items to this row would be planned
-- past jit_above_cost). plpgsql so that its plans are prepared once per connection, like a
-- statement's.
CREATE OR REPLACE FUNCTION evora.record_moves(moves evora.move[], suppressed text[])
RETURNS TABLE (notified text[], owed text[])
LANGUAGE plpgsql VOLATILE ROWS 1 AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH moved AS (
        SELECT (m.job).*, m.job AS whole, m.event, m.from_state, m.worker, m.data, m.n
        FROM unnest(moves) WITH ORDINALITY AS m(job, event, from_state, worker, data, n)
    ),
    -- One row per statement (evora.event_batches, migration 0064), the events in the order of
    -- `moves`; its data NULL when every event's is {}.
    recorded AS (
        INSERT INTO evora.event_batches (seqs, at, job_ids, job_versions, queues, types, events,
                                         from_states, to_states, attempts, worker_ids, data,
                                         jobs)
        SELECT evora.next_seqs(count(*)), updated_at, array_agg(id ORDER BY n),
               array_agg(version ORDER BY n), array_agg(queue ORDER BY n), array_agg(type ORDER BY n),
               array_agg(event ORDER BY n), array_agg(from_state ORDER BY n),
               array_agg(state ORDER BY n), array_agg(attempt ORDER BY n),
               array_agg(worker ORDER BY n),
               CASE WHEN bool_or(data <> '{}') THEN array_agg(data ORDER BY n) END,
               array_agg(evora.event_image(whole, from_state) ORDER BY n)
        FROM moved
        GROUP BY updated_at
        ORDER BY min(n)
    )
    SELECT n.notified, n.owed FROM evora.note_moves(moves, suppressed) AS n;
END
$$;

-- What `moves` change besides their events: keyed jobs tell their queue's fair claim
-- (functions/fairness.sql) that they have work again and how long ended attempts held their
-- leases, and each queue that gained a claimable job gets its NOTIFY hint, except those in
-- `suppressed`, which come back as owed. Only a move to PENDING, a move of a grouped job or of
-- a keyed one, or the end of an attempt claimed under a limit has anything to note, so a
-- transition whose jobs are none of these (evora.complete_items() for plain jobs) need not
-- call it. One row, ROWS 1, plpgsql: as evora.record_moves().
CREATE OR REPLACE FUNCTION evora.note_moves(moves evora.move[], suppressed text[])
RETURNS TABLE (notified text[], owed text[])
LANGUAGE plpgsql VOLATILE ROWS 1 AS $$
#variable_conflict use_column
BEGIN
    -- Unkeyed moves pay this one look.
    IF EXISTS (SELECT 1 FROM unnest(moves) AS m WHERE (m.job).fairness_key IS NOT NULL) THEN
        PERFORM evora.fair_note(array_agg((m.job).queue), array_agg((m.job).fairness_key),
                                array_agg(CASE WHEN m.from_state = 'RUNNING' THEN 1 ELSE 0 END),
                                array_agg(CASE WHEN m.from_state = 'RUNNING'
                                               THEN extract(epoch FROM (m.job).updated_at
                                                                       - (m.job).started_at)::float8
                                               ELSE 0 END))
        FROM unnest(moves) AS m
        WHERE (m.job).fairness_key IS NOT NULL
          AND (m.from_state = 'RUNNING' OR (m.job).state IN ('PENDING', 'WAITING'));
    END IF;
    RETURN QUERY
    -- a queue gains a claimable job when one becomes PENDING, when a group's running job
    -- moves (its next may run), and when an attempt claimed under a limit ends (its room is
    -- free again: docs/flow-control.md)
    WITH claimable AS (
        SELECT DISTINCT (m.job).queue AS q FROM unnest(moves) AS m
        WHERE (m.job).state = 'PENDING' OR (m.job).group_key IS NOT NULL
           OR ((m.job).limited AND m.from_state = 'RUNNING')
    ),
    hinted AS (
        SELECT q, pg_notify('evora_jobs', q) AS sent
        FROM claimable
        WHERE q <> ALL(suppressed)
    )
    SELECT (SELECT array_agg(q) FROM hinted),
           (SELECT array_agg(q) FROM claimable WHERE q = ANY(suppressed));
END
$$;

-- Moves `ids` (locked by the caller, PENDING under its lock) to RUNNING for `claimer`, at
-- `claimed_at`, each flagged with whether a limit applied to it (`limited_flags`, NULL:
-- none), and records their `claimed` events; returns the jobs as they now are. A statement
-- of its own, so its snapshot shows the locked rows' latest versions, whatever snapshot the
-- caller read them under.
-- Each job that has dependencies comes with the results of those COMPLETED, as
-- [[id, result], ...] in depends_on order (a dependency since pruned by retention is left
-- out); NULL for the others, which read nothing. Read here, in the claim's transaction: a
-- claim is answered with its jobs or it did not happen (a read after it committed could
-- fail and leave the jobs RUNNING with nobody holding them). This snapshot is enough, and
-- the caller's might not be (the limited claim picks under newer ones): it is taken after
-- the job was seen PENDING, so the dependency endings that released it are in it.
-- `SET random_page_cost = 1`, here and on every function that moves jobs it is given by id
-- (evora.complete_items(), evora.fail_items(), evora.end_attempts(), evora.cancel_held(),
-- evora.cancel_job(), evora.settle_dependents(); evora.store_submissions() for its keys): a
-- connection keeps the plans of a function's statements, and under the default 4 a plan made
-- while `jobs` held a few pages read it whole: a probe of the primary key (a page of the
-- index and one of the table, 4 each) cost more than one pass over a table the planner took
-- for 10 pages (1 each). Kept, it read every job on every later call, finished ones too
-- (1,208 rows for one failure beside 1,000 finished jobs and 200 running:
-- tests/integration/test_plan_traps.py). What these functions read is the rows they move
-- and the index pages that lead to them, written or read moments before and in shared
-- buffers, where a page read at random costs what the next one does: 1, PostgreSQL's own
-- advice for cached data. A lowered cost never raises a plan's total, where
-- `enable_seqscan = off` made a scan the planner could not avoid cost 1e10 on PostgreSQL
-- 14-17, past jit_above_cost (test_plan_estimates). `j.id = ANY(ids)` beside a join gives
-- the primary key the ids to probe. A plan made while the statistics said one page (a
-- VACUUM of the nearly empty table) may still read the table whole; autovacuum's next
-- ANALYZE, after a tenth of the table changed, has the connection plan it again.
-- `SET lock_timeout = '100ms'`: the one wait a claim can meet is here. Moving a grouped job
-- to RUNNING checks jobs_group_running (one RUNNING or SUSPENDED job per group), and that
-- check waits for any transaction still changing a RUNNING or SUSPENDED job of the group:
-- another claim whose snapshot saw a newer head, or a completion, cancel, heartbeat or
-- suspension of a job claimed after this claim's snapshot (or the resumption or cancel of one
-- suspended since). Meanwhile the claim holds the rows it picked, and those its `SKIP LOCKED`
-- pick found updated after its snapshot and locked to recheck (PostgreSQL keeps such a lock
-- though the row is not taken): a completion of a batch holding one of those rows and the
-- group's RUNNING job closes a cycle, and the deadlock detector (after deadlock_timeout, 1 s
-- by default) fails whichever party looks first, a worker's completion as often as the
-- claim. A claim that changed nothing can simply run again, so it gives way first: after
-- 100 ms, well before any deadlock_timeout a server keeps and well past the few
-- milliseconds another claim takes, it fails with lock_not_available and the store runs it
-- again (storage/jobs.py), under a snapshot that shows the group's new state
-- (tests/integration/test_claim_lock_waits.py builds the cycle).
CREATE OR REPLACE FUNCTION evora.claim_jobs(ids uuid[], limited_flags boolean[], claimer text,
                                 claimed_at timestamptz)
RETURNS TABLE (job evora.jobs, dependency_results jsonb)
LANGUAGE sql SET random_page_cost = 1 SET lock_timeout = '100ms' AS $$
    WITH moved AS (
        UPDATE evora.jobs j
        SET state = 'RUNNING', attempt = j.attempt + 1, lease_token = gen_random_uuid(),
            lease_expires_at = claimed_at + make_interval(secs => j.lease_seconds),
            worker_id = claimer, started_at = claimed_at, updated_at = claimed_at,
            version = j.version + 1, limited = coalesce(p.flag, false)
        FROM unnest(ids, limited_flags) WITH ORDINALITY AS p(id, flag, n)
        -- `j.id = ANY(ids)` repeats the join as a condition on jobs alone, so that the rows
        -- are found through the primary key under any plan: planned without the ids (a
        -- generic plan, kept by the connection), the planner takes the array for 10
        -- elements, and while jobs looked small it hashed them against a sequential scan
        -- that every later claim read whole, finished jobs too
        -- (tests/integration/test_claim_cost.py; on a table of a few pages, the sequential
        -- scan won even so under the default random_page_cost: the SET above).
        WHERE j.id = p.id AND j.id = ANY(ids)
        RETURNING j AS job, evora.event_image(j, 'PENDING') AS image, j.depends_on, p.n
    ),
    -- A fair claim's events carry each job's start tag and the virtual time it was chosen at
    -- ({"fair": {"tag", "vtime"}}, which evora.claim_fair() sets in `evora.fair_tags`, a JSON
    -- object by job id, around this call): the auditor checks from them that the queue's fair
    -- claims took turns and never served a job ahead of virtual time (docs/audit.md).
    fair AS (
        SELECT nullif(current_setting('evora.fair_tags', true), '')::jsonb AS tags
    ),
    -- One row for the statement's events (evora.event_batches, migration 0064), in the order
    -- of `ids`, the claim's (priority, due, submission): the events' seq says which attempt
    -- came first (the auditor charges limits in that order), and the UPDATE returns its rows
    -- in whatever order its plan finds them (by the primary key's order under some).
    recorded AS (
        INSERT INTO evora.event_batches (seqs, at, job_ids, job_versions, queues, types, events,
                                         from_states, to_states, attempts, worker_ids, data,
                                         jobs)
        SELECT evora.next_seqs(count(*)), claimed_at, array_agg((m.job).id ORDER BY m.n),
               array_agg((m.job).version ORDER BY m.n), array_agg((m.job).queue ORDER BY m.n),
               array_agg((m.job).type ORDER BY m.n),
               array_fill('claimed'::text, ARRAY[count(*)::int]),
               array_fill('PENDING'::evora.job_state, ARRAY[count(*)::int]),
               array_fill('RUNNING'::evora.job_state, ARRAY[count(*)::int]),
               array_agg((m.job).attempt ORDER BY m.n), array_fill(claimer, ARRAY[count(*)::int]),
               CASE WHEN (SELECT tags FROM fair) IS NOT NULL THEN
                   -- (a job the fair pick did not choose, an unkeyed one: {})
                   array_agg(jsonb_strip_nulls(jsonb_build_object(
                                 'fair', (SELECT tags FROM fair) -> (m.job).id::text))
                             ORDER BY m.n) END,
               array_agg(m.image ORDER BY m.n)
        FROM moved m
        HAVING count(*) > 0
    )
    SELECT m.job,
           CASE WHEN m.depends_on IS NOT NULL THEN (
               SELECT coalesce(jsonb_agg(jsonb_build_array(d.id, d.result) ORDER BY u.n), '[]')
               FROM unnest(m.depends_on) WITH ORDINALITY AS u(id, n)
               JOIN evora.jobs d ON d.id = u.id
               WHERE d.state = 'COMPLETED') END
    FROM moved m
$$;

-- The rule of "this job may be claimed now", for every claim (the unlimited `claim` in
-- storage/sql/transitions.sql and evora.claim_limited() below): PENDING (a job waiting for
-- its dependencies is WAITING), due by `at`, within its time-to-live unless it started
-- before, of one of `types` (NULL: any), in `in_queue` (the job's own, passed apart so that a
-- claim reading one queue at a time checks the pause once per queue: the check then refers to
-- nothing of the job and runs as a one-time filter), not paused. Flow-control limits are not
-- in it: evora.claim_limited() enforces them on what the rule lets through.
-- Plain SQL, STABLE, one expression without subqueries: the planner inlines it (a subquery
-- would stop it), so each claim plans the rule as if written in place, its conditions on
-- state, queue and run_at used for the index scan (tests/integration/test_claim_rule.py).
-- The FIFO group part of the rule is not in it: it needs subqueries, and a function with
-- subqueries is never inlined (called once per grouped candidate it cost ~40 % more). It is
-- the rule `group_turn` of storage/rules.sql, written into each claim and the unclaimed-jobs
-- report where they name it (a marker statements.py and migrate expand);
-- tests/integration/test_claim_rule.py proves both claims take the same jobs and the report
-- counts exactly those.
CREATE OR REPLACE FUNCTION evora.queue_paused(in_queue text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM evora.paused_queues p WHERE p.queue = in_queue)
$$;

CREATE OR REPLACE FUNCTION evora.claimable(j evora.jobs, in_queue text, at timestamptz, types text[])
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT j.state = 'PENDING'::evora.job_state AND j.queue = in_queue AND j.run_at <= at
       AND (j.expires_at IS NULL OR j.expires_at > at OR j.started_at IS NOT NULL)
       AND (types IS NULL OR j.type = ANY(types))
       AND NOT evora.queue_paused(in_queue)
$$;

-- The queues with PENDING jobs: a loose index scan of jobs_claimable, one probe per queue,
-- so the periodic readers that walk every queue with work (the unclaimed-jobs report in
-- sql/jobs.sql, a limit's wake-up in sql/limits.sql) cost what the queues are, not the backlog.
CREATE OR REPLACE FUNCTION evora.pending_queues()
RETURNS TABLE (queue text)
LANGUAGE sql STABLE ROWS 10 AS $$
    WITH RECURSIVE q(queue) AS (
        (SELECT j.queue FROM evora.jobs j WHERE j.state = 'PENDING' ORDER BY j.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT j.queue FROM evora.jobs j
                WHERE j.state = 'PENDING' AND j.queue > q.queue ORDER BY j.queue LIMIT 1)
        FROM q WHERE q.queue IS NOT NULL
    )
    SELECT q.queue FROM q WHERE q.queue IS NOT NULL
$$;

-- The priorities the PENDING jobs of each of `queues` have, lowest first: a loose index scan
-- of jobs_claimable (queue, priority, run_at, submit_seq), one probe per priority present.
-- The projector's oldest due job (`oldest_due` in sql/outbox.sql) probes each priority's
-- first job by run_at from here: jobs_claimable is the only index on every PENDING job since
-- migration 0053 dropped jobs_scheduled, its twin on (queue, run_at) that every submission
-- wrote an entry into for that reader and `next_due` alone.
CREATE OR REPLACE FUNCTION evora.pending_priorities(queues text[])
RETURNS TABLE (queue text, priority smallint)
LANGUAGE sql STABLE ROWS 10 AS $$
    WITH RECURSIVE p(queue, priority) AS (
        SELECT q.queue, (SELECT min(j.priority) FROM evora.jobs j
                         WHERE j.state = 'PENDING' AND j.queue = q.queue)
        FROM unnest(queues) AS q(queue)
        UNION ALL
        SELECT p.queue, (SELECT min(j.priority) FROM evora.jobs j
                         WHERE j.state = 'PENDING' AND j.queue = p.queue
                           AND j.priority > p.priority)
        FROM p WHERE p.priority IS NOT NULL
    )
    SELECT p.queue, p.priority FROM p WHERE p.priority IS NOT NULL
$$;

-- The claim while any limit exists (docs/flow-control.md): up to `wanted` jobs of `queues`
-- (of `types`, NULL: any), moved to RUNNING for `worker` and returned as evora.claim_jobs()
-- returns them. Works in rounds (at most four), each two statements:
--
--   1. the candidates: what earlier rounds read and did not try, and a window of claimable
--      jobs read on from where the last window of each queue ended (locked SKIP LOCKED:
--      concurrent claimers read different windows; never read twice, so a round costs the
--      same however many rows other claimers hold). The first `need` of them in round-robin
--      order over lanes are tried: the limits of their keys resolved, and each limited key's
--      lock taken without waiting, its flow_buckets row FOR UPDATE SKIP LOCKED or, for a key
--      without a row yet, a transaction advisory lock under which the row is made. A key
--      someone else holds is blocked for the rest of the claim.
--   2. in a new snapshot (every earlier claim of the locked keys is committed and visible,
--      no other can be in flight), the room of each key (concurrency minus its RUNNING
--      holders; whole tokens), the tried jobs admitted within it, the tokens taken. Keys left
--      without room are blocked for the next rounds.
--
-- Each round's jobs are moved by evora.claim_jobs() right after the round took their tokens:
-- every statement here takes a newer snapshot than the caller's, so a job that became visible
-- meanwhile could be picked and paid for and then never found by an UPDATE under an older
-- snapshot. The jobs a claim moves are exactly the jobs it paid for, and the rounds that
-- follow see them RUNNING.
--
-- Tokens are counted as of a clock read after the bucket's lock is held (`evora.clock_now()` plus
-- the time since the transaction began, so the tests' clock offset still applies), and
-- `refilled_at` only ever moves forward: a claim that began before another but locked the
-- bucket after the other committed would otherwise move the bucket back in time.
--
-- A grouped job is claimable only as the head of its (queue, group) and only while no job of
-- its group runs or is suspended (rules.sql, group_turn). Both checks are scalar subqueries
-- (`(SELECT true ... LIMIT 1) IS NULL`), which PostgreSQL never hashes: each grouped
-- candidate probes jobs_group_running and jobs_group_pending by its own key, under custom and
-- generic plans alike, instead of a hashed subplan built from every RUNNING job of every queue
-- (tests/integration/test_claim_cost.py). The unlimited claim in storage/sql/transitions.sql
-- does the same.
--
-- A claim never waits for another: every lock it takes skips what is held (an INSERT ... ON
-- CONFLICT making a new bucket row would wait for a concurrent insert of the same key, and
-- two claims doing so in different orders would deadlock).
--
-- Fair queues (docs/flow-control.md, "Fairness and limits"): the one exception to never
-- waiting is a fair queue's turn, its fair_queues row, which serialises the queue's claims
-- as in evora.claim_fair(). It is taken first, for every fair queue of the claim in name
-- order, before any other lock: every lock taken after it skips what is held, so a claim
-- waiting for a turn holds nothing another claim waits for, and no cycle can close. Each
-- round takes the fair queues' keyed candidates from evora.fair_pick() (the `need` smallest
-- start tags among jobs holding no blocked key), ahead of the windows and in that order
-- (`fair_rank`), so the limits' room goes to the smallest tags first and a key without room
-- gives its turn to the next fair choice; the keys are charged (evora.fair_charge()) for
-- the jobs the round moved, and only those. Windows read only unkeyed jobs, and a fair
-- queue's window only in a round its keys did not fill.
--
-- The count of the RUNNING jobs holding the locked keys states the predicate of
-- jobs_running_limit_keys as that index writes it (`state >= 'RUNNING' AND state <= 'RUNNING'`,
-- migration 0062), so that it can use no other partial index of RUNNING jobs, and
-- `SET random_page_cost = 1` (as on evora.claim_jobs(), which says why) makes the GIN probe
-- cheaper than one pass over a table of a few pages: under any plan a connection keeps, the
-- count reads the holders of its keys, not every RUNNING job
-- (tests/integration/test_plan_traps.py).
CREATE OR REPLACE FUNCTION evora.claim_limited(queues text[], types text[], wanted integer, worker text)
RETURNS TABLE (job evora.jobs, dependency_results jsonb)
LANGUAGE plpgsql ROWS 1 SET random_page_cost = 1 AS $$
DECLARE
    at CONSTANT timestamptz := evora.clock_now();
    -- the advisory lock class of "making the bucket row of a key" (the key's hash is the
    -- second half): the two-integer lock space, apart from the 64-bit keys of
    -- evora.storage.locks
    making CONSTANT integer := 1163284306;  -- 'EVOR'
    taken integer := 0;
    -- the clock as of the round's locks (see the header)
    paid timestamptz;
    blocked text[] := '{}';
    -- candidates read (and locked) but not tried yet
    rest evora.claim_candidate[] := '{}';
    -- the queues whose last window came back full, and where it ended: first, before any
    -- job (submit_seq counts from 1)
    open_queues text[] := queues;
    last_priority smallint[] := array_fill((-32768)::smallint, ARRAY[cardinality(queues)]);
    last_run_at timestamptz[] := array_fill('-infinity'::timestamptz, ARRAY[cardinality(queues)]);
    last_seq bigint[] := array_fill(0::bigint, ARRAY[cardinality(queues)]);
    -- whether windows are read wide (4 x what is still wanted): round-robin order over a
    -- narrow window (what is wanted and a few more) tries the same jobs as over a wide one
    -- when no lane comes twice among them; one queue's window is first read narrow, and
    -- widened only when a lane does
    wide boolean := cardinality(queues) <> 1;
    widen boolean;
    rounds integer := 0;
    window_size integer;
    need integer;
    tried evora.claim_candidate[];
    lim_keys text[];
    lim_conc integer[];
    lim_rate integer[];
    lim_per float8[];
    owned text[];
    new_ids uuid[];
    new_flags boolean[];
    full_keys text[];
    -- the claim's fair queues, their turns held (see the header)
    fair_qs text[];
    -- the round's fair candidates, in fair order, and what charging them takes: each one's
    -- queue, key, and its key's start and cost
    fair_cands evora.claim_candidate[] := '{}';
    fair_ids uuid[];
    fair_queue text[];
    fair_key text[];
    fair_start float8[];
    fair_cost float8[];
    -- the fair queues whose keys filled the round: their windows are not read
    fair_full text[] := '{}';
BEGIN
    fair_qs := ARRAY(SELECT f.queue FROM evora.fair_queues f WHERE f.queue = ANY(queues)
                     ORDER BY f.queue FOR UPDATE);
    PERFORM evora.fair_fold(f.queue) FROM unnest(fair_qs) AS f(queue);
    WHILE rounds < 4 LOOP
        need := wanted - taken;
        EXIT WHEN need <= 0;
        rest := ARRAY(SELECT r FROM unnest(rest) AS r WHERE NOT (r.keys && blocked));
        IF cardinality(fair_qs) > 0 THEN
            -- in a statement of its own, after the turns were granted and the last round's
            -- charge: the choice reads final virtual times
            WITH picked AS MATERIALIZED (
                SELECT q.queue, p.*,
                       row_number() OVER (ORDER BY q.queue, p.tag, p.priority, p.run_at,
                                                   p.submit_seq) AS place,
                       count(*) OVER (PARTITION BY q.queue) AS n
                FROM unnest(fair_qs) AS q(queue)
                CROSS JOIN LATERAL evora.fair_pick(q.queue, at, types, need, blocked) AS p
                WHERE NOT ('queue:' || q.queue = ANY(blocked))
            ),
            tried AS MATERIALIZED (
                SELECT * FROM picked p WHERE p.place <= need
            )
            SELECT ARRAY(SELECT ROW(t.id, t.priority, t.run_at, t.submit_seq,
                                    ARRAY(SELECT DISTINCT x
                                          FROM unnest(('queue:' || t.queue) || t.limit_keys)
                                              AS x),
                                    coalesce(t.limit_keys[1], ''),
                                    t.place)::evora.claim_candidate
                         FROM tried t ORDER BY t.place),
                   ARRAY(SELECT t.id FROM tried t ORDER BY t.place),
                   ARRAY(SELECT t.queue FROM tried t ORDER BY t.place),
                   ARRAY(SELECT t.key FROM tried t ORDER BY t.place),
                   ARRAY(SELECT t.start FROM tried t ORDER BY t.place),
                   ARRAY(SELECT t.cost FROM tried t ORDER BY t.place),
                   ARRAY(SELECT DISTINCT p.queue FROM picked p WHERE p.n >= need)
            INTO fair_cands, fair_ids, fair_queue, fair_key, fair_start, fair_cost, fair_full;
        END IF;
        window_size := greatest(CASE WHEN wide THEN 4 * need ELSE need END + 16
                                - cardinality(rest), 0);

        WITH fresh AS MATERIALIZED (
            SELECT q.queue, c.id, c.priority, c.run_at, c.submit_seq,
                   ARRAY(SELECT DISTINCT x
                         FROM unnest(('queue:' || q.queue) || c.limit_keys) AS x) AS keys,
                   coalesce(c.limit_keys[1], '') AS lane
            FROM unnest(open_queues, last_priority, last_run_at, last_seq)
                AS q(queue, priority, run_at, seq)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, j.submit_seq, j.limit_keys
                FROM evora.jobs j
                WHERE evora.claimable(j, q.queue, at, types)
                  AND (j.priority, j.run_at, j.submit_seq) > (q.priority, q.run_at, q.seq)
                  -- FIFO groups: the rule every claim states (rules.sql, which says why
                  -- it is written in place, not called)
                  AND {{rule:group_turn}}
                  AND NOT (j.limit_keys && blocked)
                  -- keyed jobs are a fair queue's, chosen by evora.fair_pick() above (a queue
                  -- has them only once it is fair: the job's submission makes it so)
                  AND j.fairness_key IS NULL
                ORDER BY j.priority, j.run_at, j.submit_seq
                LIMIT window_size
                -- The window is locked, as the unlimited claim locks its jobs: concurrent
                -- claimers then read different windows (and try different keys) instead of
                -- all contending for the head of the queue. FOR UPDATE re-checks the row
                -- under its lock, so what it returns is PENDING and ours. Rows left
                -- unclaimed are free again when the claim commits.
                FOR UPDATE OF j SKIP LOCKED
            ) AS c
            WHERE NOT ('queue:' || q.queue = ANY(blocked)) AND NOT (q.queue = ANY(fair_full))
        ),
        -- where each queue's window ended, for the queues whose window came back full (with
        -- no window read, the queues stay as they were)
        ends AS MATERIALIZED (
            SELECT e.queue, e.priority, e.run_at, e.submit_seq
            FROM (SELECT f.queue, f.priority, f.run_at, f.submit_seq,
                         count(*) OVER (PARTITION BY f.queue) AS n,
                         row_number() OVER (PARTITION BY f.queue
                                            ORDER BY f.priority DESC, f.run_at DESC,
                                                     f.submit_seq DESC) AS back
                  FROM fresh f) AS e
            WHERE e.back = 1 AND e.n = window_size
            UNION ALL
            SELECT * FROM unnest(open_queues, last_priority, last_run_at, last_seq)
                AS o(queue, priority, run_at, submit_seq)
            WHERE window_size = 0 OR o.queue = ANY(fair_full)
        ),
        win AS MATERIALIZED (
            SELECT f.id, f.priority, f.run_at, f.submit_seq, f.keys, f.lane FROM fresh f
            UNION ALL
            SELECT r.id, r.priority, r.run_at, r.submit_seq, r.keys, r.lane
            FROM unnest(rest) AS r
        ),
        -- the first `need` (after the fair candidates) in round-robin order over the lanes:
        -- the others only decide the turns, and stay for the next round
        turns AS MATERIALIZED (
            SELECT ROW(w.id, w.priority, w.run_at, w.submit_seq, w.keys,
                       w.lane, NULL)::evora.claim_candidate AS c,
                   row_number() OVER (ORDER BY w.priority, w.turn, w.run_at, w.submit_seq)
                       <= need - cardinality(fair_cands) AS tried,
                   w.turn
            FROM (SELECT w.*, row_number() OVER (PARTITION BY w.lane
                                                 ORDER BY w.priority, w.run_at, w.submit_seq)
                                  AS turn
                  FROM win w) AS w
        ),
        -- a narrow window that came back full, with a lane twice among the jobs to try: read
        -- on wide before trying any
        widening AS MATERIALIZED (
            SELECT NOT wide AND EXISTS (SELECT 1 FROM ends)
                   AND EXISTS (SELECT 1 FROM turns t WHERE t.tried AND t.turn > 1) AS yes
        ),
        gov AS MATERIALIZED (
            SELECT * FROM evora.governing_limits(
                ARRAY(SELECT DISTINCT k
                      FROM (SELECT (t.c).keys FROM turns t WHERE t.tried
                            UNION ALL
                            SELECT f.keys FROM unnest(fair_cands) AS f) AS t(keys),
                           unnest(t.keys) AS k
                      WHERE NOT (SELECT w.yes FROM widening w)))
        ),
        row_locked AS MATERIALIZED (
            SELECT b.key FROM evora.flow_buckets b
            WHERE b.key = ANY(ARRAY(SELECT g.key FROM gov g))
            ORDER BY b.key
            FOR UPDATE SKIP LOCKED
        ),
        -- A key with no bucket row in this snapshot is made under its advisory lock, so two
        -- claims never insert the same key at once (the second would wait for the first). If
        -- another claim made the row since this snapshot, the insert finds it and does
        -- nothing: the key is blocked for this claim, as if locked. (Materialized first:
        -- only these keys take an advisory lock.)
        missing AS MATERIALIZED (
            SELECT g.key, g.rate_limit FROM gov g
            WHERE NOT EXISTS (SELECT 1 FROM evora.flow_buckets o WHERE o.key = g.key)
        ),
        made AS (
            INSERT INTO evora.flow_buckets AS b (key, tokens, refilled_at)
            SELECT m.key, coalesce(m.rate_limit, 0), at
            FROM missing m
            WHERE pg_try_advisory_xact_lock(making, hashtext(m.key))
            ON CONFLICT (key) DO NOTHING
            RETURNING b.key
        ),
        mine AS (
            SELECT key FROM row_locked UNION ALL SELECT key FROM made
        )
        SELECT (SELECT w.yes FROM widening w),
               ARRAY(SELECT t.c FROM turns t WHERE t.tried),
               ARRAY(SELECT t.c FROM turns t WHERE NOT t.tried),
               ARRAY(SELECT e.queue FROM ends e ORDER BY e.queue),
               ARRAY(SELECT e.priority FROM ends e ORDER BY e.queue),
               ARRAY(SELECT e.run_at FROM ends e ORDER BY e.queue),
               ARRAY(SELECT e.submit_seq FROM ends e ORDER BY e.queue),
               ARRAY(SELECT g.key FROM gov g ORDER BY g.key),
               ARRAY(SELECT g.concurrency FROM gov g ORDER BY g.key),
               ARRAY(SELECT g.rate_limit FROM gov g ORDER BY g.key),
               ARRAY(SELECT g.rate_per_seconds FROM gov g ORDER BY g.key),
               ARRAY(SELECT m.key FROM mine m),
               ARRAY(SELECT g.key FROM gov g
                     WHERE NOT EXISTS (SELECT 1 FROM mine m WHERE m.key = g.key))
        INTO widen, tried, rest, open_queues, last_priority, last_run_at, last_seq,
             lim_keys, lim_conc, lim_rate, lim_per, owned, full_keys;
        IF widen THEN
            rest := tried || rest;
            wide := true;
            CONTINUE;
        END IF;
        tried := fair_cands || tried;
        EXIT WHEN cardinality(tried) = 0;
        blocked := blocked || full_keys;

        -- A new statement, so a new snapshot, taken after the locks above were granted; and
        -- the time of the tokens, read after them too.
        paid := evora.clock_now() + (clock_timestamp() - now());
        WITH c AS (SELECT * FROM unnest(tried) AS c),
        lim AS (
            SELECT * FROM unnest(lim_keys, lim_conc, lim_rate, lim_per) AS u(key, conc, rate, per)
        ),
        mine AS (SELECT DISTINCT key FROM unnest(owned) AS m(key)),
        -- RUNNING jobs holding the locked keys (a job holding `queue:<q>` in its limit_keys
        -- too counts once): the keys' holders through jobs_running_limit_keys (its predicate
        -- as written: see the header), and each locked `queue:` key's RUNNING jobs by a
        -- subquery of its own, which runs only for such a key (`r.queue = ANY(...)` over
        -- every RUNNING job read them all to find none when no `queue:` key was locked)
        running AS (
            SELECT k.key, count(*) AS n
            FROM evora.jobs r
            CROSS JOIN LATERAL unnest(r.limit_keys) AS k(key)
            JOIN mine m ON m.key = k.key
            WHERE r.state >= 'RUNNING' AND r.state <= 'RUNNING' AND r.limit_keys <> '{}'
              AND r.limit_keys && owned
              AND k.key <> 'queue:' || r.queue
            GROUP BY k.key
            UNION ALL
            SELECT m.key, (SELECT count(*) FROM evora.jobs r
                           WHERE r.state = 'RUNNING' AND r.queue = substr(m.key, 7))
            FROM mine m
            WHERE starts_with(m.key, 'queue:')
        ),
        caps AS MATERIALIZED (
            SELECT l.key, l.rate, l.per, least(
                l.conc - coalesce(r.n, 0),
                floor(evora.tokens(b, l.rate, l.per, paid))::bigint) AS cap
            FROM lim l
            JOIN mine m ON m.key = l.key
            JOIN evora.flow_buckets b ON b.key = l.key
            LEFT JOIN (SELECT key, sum(n) AS n FROM running GROUP BY key) AS r ON r.key = l.key
        ),
        -- each tried job's place in the line of every locked key it holds
        ranked AS (
            SELECT c.id, x.cap,
                   row_number() OVER (PARTITION BY x.key
                                      ORDER BY c.fair_rank, c.priority, c.run_at, c.submit_seq)
                       AS place
            FROM c
            CROSS JOIN LATERAL unnest(c.keys) AS k(key)
            JOIN caps x ON x.key = k.key
        ),
        admitted AS (
            SELECT c.id, c.priority, c.run_at, c.submit_seq, c.keys, c.fair_rank,
                   c.keys && lim_keys AS is_limited,
                   row_number() OVER (PARTITION BY c.lane
                                      ORDER BY c.priority, c.run_at, c.submit_seq) AS turn
            FROM c
            WHERE NOT (c.keys && full_keys)
              AND NOT EXISTS (SELECT 1 FROM ranked r
                              WHERE r.id = c.id AND r.cap IS NOT NULL AND r.place > r.cap)
        ),
        chosen AS MATERIALIZED (
            SELECT a.id, a.is_limited, a.keys FROM admitted a
            ORDER BY a.fair_rank, a.priority, a.turn, a.run_at, a.submit_seq
            LIMIT need
        ),
        used AS MATERIALIZED (
            SELECT x.key, count(*) AS n
            FROM (SELECT unnest(ch.keys) AS key FROM chosen ch) AS k
            JOIN caps x ON x.key = k.key
            GROUP BY x.key
        ),
        -- the tokens taken; a bucket another claim left later than `paid` (its clock ahead of
        -- this one's) keeps its time, and credits nothing twice
        spent AS (
            UPDATE evora.flow_buckets b
            SET tokens = evora.tokens(b, x.rate, x.per, paid) - u.n,
                refilled_at = greatest(b.refilled_at, paid)
            FROM used u JOIN caps x ON x.key = u.key
            WHERE b.key = u.key AND x.rate IS NOT NULL
        )
        SELECT ARRAY(SELECT ch.id FROM chosen ch),
               ARRAY(SELECT ch.is_limited FROM chosen ch),
               -- keys left without room
               ARRAY(SELECT x.key FROM caps x LEFT JOIN used u ON u.key = x.key
                     WHERE x.cap - coalesce(u.n, 0) <= 0)
        INTO new_ids, new_flags, full_keys;
        -- moved now, under the locks and the snapshot they were paid for in
        RETURN QUERY SELECT * FROM evora.claim_jobs(new_ids, new_flags, worker, paid);
        IF cardinality(fair_cands) > 0 THEN
            PERFORM evora.fair_charge(array_agg(f.queue), array_agg(f.key), array_agg(f.start),
                                      array_agg(f.cost))
            FROM unnest(fair_ids, fair_queue, fair_key, fair_start, fair_cost)
                AS f(id, queue, key, start, cost)
            WHERE f.id = ANY(new_ids);
        END IF;
        taken := taken + cardinality(new_ids);
        rounds := rounds + 1;
        blocked := blocked || full_keys;
        EXIT WHEN cardinality(rest) = 0 AND cardinality(open_queues) = 0;
    END LOOP;
END
$$;

-- The signature the previous release's claim statement calls (migration 0022's; 0025 made
-- the function anew with the claimer in and the jobs out). PostgreSQL resolves a function
-- when it parses a statement, so without it every claim of a dispatcher of that release
-- fails while a rolling upgrade runs, with or without flow limits
-- (tests/e2e/test_rolling_upgrade.py). It picks nothing: while a limit exists, the old
-- dispatchers claim nothing and this release's claim the jobs, so no limit is ever paid for
-- twice. Expand/contract: the release after this one drops it (docs/deploy.md, Upgrades).
CREATE OR REPLACE FUNCTION evora.claim_limited(queues text[], types text[], wanted integer)
RETURNS TABLE (id uuid, limited boolean)
LANGUAGE sql STABLE ROWS 1 AS $$
    SELECT NULL::uuid, NULL::boolean WHERE false
$$;

-- Three statements end attempts: evora.fail_items() (a worker's failure), `release` (a worker hands the
-- claim back, or snoozes: hands it back to run again later) and `expire_leases` (the sweeper, for a lease that ran out). Each decides, under
-- its own fence and lock, where each attempt goes (one `evora.attempt_end` per job); this
-- moves every decided job that is still RUNNING (the caller holds its row lock) and records
-- it, the same way for all three; it returns each moved job whole, with the queues notified
-- and owed (evora.record_moves).
--
-- The fence, "the job is still RUNNING", comes with each attempt (`fenced`, in a materialized
-- CTE so that it stays a column and is not folded back into a constant), which makes it part
-- of the join: each attempt is one probe of the primary key. Written as `j.state =
-- 'RUNNING'`, it was a filter the planner could serve by scanning every RUNNING job of every
-- queue and hash-joining the attempts to them (a failure of one job read thousands of rows
-- while thousands ran elsewhere). evora.complete_items() and evora.fail_items() (below) do
-- the same. ROWS 100: one row per job moved, out of those
-- given (a batch of acks, a sweep); without it the planner takes a set-returning PL/pgSQL
-- function for 1,000 rows, and the statements that join it cross jit_above_cost.
CREATE OR REPLACE FUNCTION evora.end_attempts(ends evora.attempt_end[], suppressed text[])
RETURNS TABLE (job evora.jobs, notified text[], owed text[])
LANGUAGE plpgsql VOLATILE ROWS 100 SET random_page_cost = 1 AS $$
#variable_conflict use_column
DECLARE
    ids CONSTANT uuid[] := ARRAY(SELECT e.id FROM unnest(ends) AS e);
BEGIN
    RETURN QUERY
    WITH decided AS MATERIALIZED (
        SELECT *, 'RUNNING'::evora.job_state AS fenced FROM unnest(ends)
    ),
    moved AS (
        UPDATE evora.jobs j
        SET state = d.to_state,
            -- a release hands the claim back uncounted, unless it ends the job (cancel
            -- requested): then the attempt ran and stays counted
            attempt = j.attempt - CASE WHEN d.released AND d.to_state = 'PENDING' THEN 1 ELSE 0 END,
            -- a snooze is a release that asks to run again later: counted apart, so the job
            -- shows how often it waited though its attempt number did not grow
            snoozes = j.snoozes + CASE WHEN d.pending_event = 'snoozed' AND d.to_state = 'PENDING'
                                       THEN 1 ELSE 0 END,
            last_error = coalesce(d.error, j.last_error),
            lease_expires_at = NULL,
            run_at = CASE WHEN d.to_state = 'PENDING'
                          THEN evora.clock_now() + make_interval(secs => d.delay) ELSE j.run_at END,
            finished_at = CASE WHEN d.to_state = 'PENDING' THEN NULL ELSE evora.clock_now() END,
            updated_at = evora.clock_now(), version = j.version + 1
        -- `j.id = ANY(ids)` and the SET: through the primary key under any plan, as in
        -- evora.claim_jobs() (a plan made while jobs was small read the whole table on every
        -- failure, release, snooze, lease expiry and timeout)
        FROM decided d WHERE j.id = d.id AND j.state = d.fenced AND j.id = ANY(ids)
        RETURNING j AS whole, ROW(
            j,
            CASE WHEN d.to_state = 'CANCELLED' THEN 'cancelled'
                 WHEN d.to_state = 'DLQ' THEN 'dead_lettered'
                 ELSE d.pending_event END,
            'RUNNING',
            d.worker,
            (SELECT coalesce(jsonb_object_agg(key, value), '{}')
             FROM jsonb_each(jsonb_build_object(
                 'error', d.error, 'reason', d.reason,
                 'retry_at', CASE WHEN d.to_state = 'PENDING' THEN j.run_at END))
             WHERE value <> 'null')
        )::evora.move AS move
    ),
    recorded AS (
        SELECT * FROM evora.record_moves(ARRAY(SELECT move FROM moved), suppressed)
    )
    SELECT m.whole, r.notified, r.owed
    FROM moved m CROSS JOIN recorded r;
END
$$;

-- Moves DLQ jobs the caller holds locked: to PENDING (a retry: a fresh attempt budget, due
-- now, a time-to-live that already ran out dropped because the operator asked for the job to
-- run) or to CANCELLED (a discard). Returns each moved job whole, with the queues notified and
-- owed (evora.record_moves): ROWS 100, as evora.end_attempts().
CREATE OR REPLACE FUNCTION evora.leave_dlq(ids uuid[], to_state evora.job_state, suppressed text[])
RETURNS TABLE (job evora.jobs, notified text[], owed text[])
LANGUAGE plpgsql VOLATILE ROWS 100 AS $$
#variable_conflict use_column
DECLARE
    retried CONSTANT boolean := to_state = 'PENDING';
BEGIN
    IF to_state NOT IN ('PENDING', 'CANCELLED') THEN
        RAISE EXCEPTION 'a job leaves the DLQ to PENDING or CANCELLED, not %', to_state;
    END IF;
    RETURN QUERY
    WITH moved AS (
        UPDATE evora.jobs j
        SET state = to_state,
            attempt = CASE WHEN retried THEN 0 ELSE j.attempt END,
            run_at = CASE WHEN retried THEN evora.clock_now() ELSE j.run_at END,
            finished_at = CASE WHEN retried THEN NULL ELSE evora.clock_now() END,
            expires_at = CASE WHEN retried AND j.expires_at <= evora.clock_now() THEN NULL
                              ELSE j.expires_at END,
            lease_expires_at = NULL, updated_at = evora.clock_now(), version = j.version + 1
        WHERE j.id = ANY(ids) AND j.state = 'DLQ'
        RETURNING j AS whole, ROW(
            j,
            CASE WHEN retried THEN 'retried' ELSE 'cancelled' END,
            'DLQ',
            NULL,
            CASE WHEN retried THEN '{}' ELSE '{"reason": "discarded"}' END::jsonb
        )::evora.move AS move
    ),
    recorded AS (
        SELECT * FROM evora.record_moves(ARRAY(SELECT move FROM moved), suppressed)
    )
    SELECT m.whole, r.notified, r.owed
    FROM moved m CROSS JOIN recorded r;
END
$$;

-- Cancels jobs the caller holds locked, each by the rule of a cancel: PENDING, WAITING and
-- SUSPENDED at once (a SUSPENDED job's callback is settled `cancelled`, under the job's lock as
-- every change of a callback, so resolving it is refused; the jobs that wait on a cancelled
-- job follow, by the database's dependency trigger), RUNNING by cancel_requested (once: its
-- worker decides); any other state is left as it is. An admin's cancel runs it for the job
-- and then for the children its spawns made (evora.cancel_job()). Each of its statements
-- takes a new snapshot, and the caller's lock was granted before: it decides on each job's
-- newest version, the state the job is really in, even when the caller's snapshot predates a
-- claim or a dependency's completion that the lock waited for. Returns each moved job whole, with the queues notified and owed
-- (evora.record_moves).
CREATE OR REPLACE FUNCTION evora.cancel_held(ids uuid[], suppressed text[])
RETURNS TABLE (job evora.jobs, notified text[], owed text[])
LANGUAGE sql VOLATILE ROWS 100 SET random_page_cost = 1 AS $$
    WITH target AS (
        SELECT j.id, j.state FROM evora.jobs j
        WHERE j.id = ANY(ids)
          -- Not `state IN (...) OR (state = 'RUNNING' AND ...)`: a plan may take each arm
          -- through an index of its own and OR them, the first through jobs_listing_by_id
          -- (its id, under a skip scan) and the second through jobs_running_lease, which
          -- reads every RUNNING job on every cancel (tests/integration/test_plan_traps.py).
          -- Stated so, no arm but the id is usable alone: the primary key's probes.
          AND j.state IN ('PENDING', 'WAITING', 'SUSPENDED', 'RUNNING')
          AND (j.state <> 'RUNNING' OR NOT j.cancel_requested)
    ),
    moved AS (
        UPDATE evora.jobs j
        SET state = CASE WHEN t.state = 'RUNNING' THEN j.state ELSE 'CANCELLED' END,
            cancel_requested = (t.state = 'RUNNING'),
            finished_at = CASE WHEN t.state = 'RUNNING' THEN NULL ELSE evora.clock_now() END,
            updated_at = evora.clock_now(), version = j.version + 1
        -- `j.id = ANY(ids)` and the SET: through the primary key under any plan
        -- (evora.claim_jobs())
        FROM target t WHERE j.id = t.id AND j.id = ANY(ids)
        RETURNING j AS whole, t.state AS from_state,
            ROW(j, CASE WHEN t.state = 'RUNNING' THEN 'cancel_requested' ELSE 'cancelled' END,
                t.state, j.worker_id, '{}')::evora.move AS move
    ),
    voided AS (
        UPDATE evora.callbacks c SET outcome = 'cancelled', settled_at = evora.clock_now()
        FROM moved m
        WHERE m.from_state = 'SUSPENDED' AND c.job_id = (m.whole).id AND c.outcome IS NULL
    ),
    recorded AS (
        SELECT * FROM evora.record_moves(ARRAY(SELECT move FROM moved), suppressed)
    )
    SELECT m.whole, r.notified, r.owed
    FROM moved m CROSS JOIN recorded r
$$;

-- An admin's cancel of one job (the `cancel` statement, storage/sql/transitions.sql): the job
-- by evora.cancel_held()'s rule and, when it is cancelled at once, the unfinished children its
-- spawns made (evora.spawned_tree(), docs/jobs-that-wait.md), each as a cancel of it alone
-- would, all in one statement of the caller's. The job and its children are locked first, in
-- the order of evora.hold_spawned_tree() (which says why): a child ending locks the child and
-- then its waiting parent (the dependency settlement), so a cancel that took the parent first
-- and then waited for that child would deadlock with it. The tree is read again once the job
-- is held: a spawn that committed meanwhile made children the first read could not see. Each
-- statement takes a new snapshot after the locks it needs were granted, so the decision is
-- made on the state the job is really in. Exactly one row: the outcome ('done', 'refused' or
-- 'not_found'), the job, moved or as it refused (its newest version: a locking read waits for
-- whatever moved it out of reach), and the queues notified and owed.
CREATE OR REPLACE FUNCTION evora.cancel_job(job_id uuid, suppressed text[])
RETURNS TABLE (outcome text, job evora.jobs, notified text[], owed text[])
LANGUAGE plpgsql VOLATILE ROWS 1 SET random_page_cost = 1 AS $$
DECLARE
    parent RECORD;
    current evora.jobs;
    family_notified text[];
    family_owed text[];
BEGIN
    -- `= ANY(ARRAY(...))` (in evora.hold_spawned_tree()) and the SET (evora.claim_jobs()), a
    -- probe of the primary key per child under any plan: as `IN (SELECT ...)`, a plan made
    -- while jobs was small read it whole on every cancel (6,126 rows to cancel one PENDING
    -- job beside 1,200 others, tests/integration/test_plan_traps.py)
    PERFORM evora.hold_spawned_tree(job_id);
    -- held already: its newest version
    SELECT j.* INTO current FROM evora.jobs j WHERE j.id = job_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'not_found', NULL::evora.jobs, NULL::text[], NULL::text[];
        RETURN;
    END IF;
    SELECT c.job, c.notified, c.owed INTO parent
    FROM evora.cancel_held(ARRAY[job_id], suppressed) AS c;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'refused', current, NULL::text[], NULL::text[];
        RETURN;
    END IF;
    IF (parent.job).state = 'CANCELLED' THEN
        SELECT c.notified, c.owed INTO family_notified, family_owed
        FROM evora.cancel_held(evora.hold_spawned_tree(job_id), suppressed || parent.notified)
            AS c
        LIMIT 1;
    END IF;
    RETURN QUERY SELECT 'done', parent.job, parent.notified || family_notified,
                        parent.owed || family_owed;
END
$$;

-- A worker's completions and failures, in batches: the `complete` and `fail` statements of
-- storage/sql/transitions.sql (the dispatcher's acks) and evora.complete()/evora.fail() below
-- (a worker's own transaction) all run these, so the rules are the same whichever way an
-- outcome arrives.
--
-- evora.complete_items(): ids, lease tokens and results, one of each per item; the queues
-- this process notified a moment ago (`suppressed`); whether to return the jobs.
-- Acks arrive in batches (one /v1/acks request, or concurrent single requests coalesced), and a
-- batch may name a job more than once: a stale worker's token beside the owner's, or the
-- owner's retry. Items are therefore kept per (id, token), never merged per id: only the item
-- carrying the current lease token can match its job, whatever else the batch holds, and a
-- repeat of the same (id, token) keeps its first occurrence. Each changed job comes back with
-- its lease token. Every item, repeats included, gets one row in its own position: the
-- winner 'done' with its job; a repeat of a winner is a replay, answered 'done' with the same
-- job; any other item as if it came alone, after the winners: 'done' if its job was already
-- COMPLETED under its token (a retry after a lost answer), else 'lease_lost' or 'not_found'.
-- Without `with_jobs` the jobs are left out (a batch of acks reports outcomes only).
-- plpgsql, so that its plan is prepared once per connection, like a statement's, and the one
-- statement takes one snapshot, as the statement did.
CREATE OR REPLACE FUNCTION evora.complete_items(
    ids uuid[], tokens uuid[], results jsonb[], suppressed text[], with_jobs boolean
) RETURNS TABLE (outcome text, job evora.jobs, notified text[], owed text[])
LANGUAGE plpgsql VOLATILE ROWS 100 SET random_page_cost = 1 AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH items AS (
        SELECT *
        FROM unnest(ids, tokens, results) WITH ORDINALITY AS i(id, token, result, ord)
    ),
    -- The fence's state comes with the items (`fenced`), so that it joins each item to its job
    -- rather than filtering `jobs`: as a filter, the planner may read it as "scan every RUNNING
    -- job" (through an index on state, every queue's) and hash-join the items to them, an ack
    -- costing as much as the jobs running anywhere (tests/integration/test_ack_cost.py). Joined,
    -- each item is one probe of the primary key. (DISTINCT ON keeps `input` a subquery of its
    -- own, so `fenced` stays a column instead of being folded back into a constant filter.)
    input AS (
        SELECT DISTINCT ON (id, token) *, 'RUNNING'::evora.job_state AS fenced
        FROM items ORDER BY id, token, ord
    ),
    moved AS (
        UPDATE evora.jobs j
        SET state = 'COMPLETED', result = i.result, lease_expires_at = NULL,
            finished_at = evora.clock_now(), updated_at = evora.clock_now(),
            version = j.version + 1
        -- `j.id = ANY(ids)`: through the primary key under any plan, as in evora.claim_jobs()
        -- (a generic plan made while jobs was small read the whole table on every ack).
        FROM input i WHERE j.id = i.id AND j.lease_token = i.token AND j.state = i.fenced
                       AND j.id = ANY(ids)
        RETURNING j.id, j.lease_token, j AS job, j.version, j.queue, j.type, j.attempt,
                  j.worker_id, j.updated_at, pg_column_size(i.result) AS result_bytes,
                  evora.event_image(j, 'RUNNING') AS image,
                  j.group_key IS NOT NULL OR j.limited OR j.fairness_key IS NOT NULL AS noted
    ),
    -- The events are written here, by the completion's own statement, as the claim writes its
    -- own (evora.claim_jobs()), rather than by evora.record_moves(): that one is a PL/pgSQL
    -- call and a statement of its own, and each job would be copied into an evora.move and
    -- read back out of it, together ~7 % of PostgreSQL's CPU per drained job
    -- (docs/benchmarks/2026-11-29-postgresql-cpu-profile.md). Only the jobs with something to
    -- note (evora.note_moves(): grouped, claimed under a limit, or keyed) go through it, and a
    -- batch with none does not call it (the one-time filter on `noted`).
    -- One row for the statement's events (evora.event_batches, migration 0064), in whatever
    -- order the UPDATE found the jobs: each array is aggregated from the same rows in the same
    -- order.
    recorded AS (
        INSERT INTO evora.event_batches (seqs, at, job_ids, job_versions, queues, types, events,
                                         from_states, to_states, attempts, worker_ids, data,
                                         jobs)
        SELECT evora.next_seqs(count(*)), m.updated_at, array_agg(m.id), array_agg(m.version), array_agg(m.queue),
               array_agg(m.type), array_fill('completed'::text, ARRAY[count(*)::int]),
               array_fill('RUNNING'::evora.job_state, ARRAY[count(*)::int]),
               array_fill('COMPLETED'::evora.job_state, ARRAY[count(*)::int]),
               array_agg(m.attempt), array_agg(m.worker_id),
               array_agg(jsonb_build_object('result_bytes', m.result_bytes)), array_agg(m.image)
        FROM moved m
        GROUP BY m.updated_at
    ),
    notes AS (
        SELECT n.notified, n.owed
        FROM evora.note_moves(ARRAY(SELECT ROW(m.job, 'completed', 'RUNNING', m.worker_id,
                                               NULL)::evora.move
                                    FROM moved m WHERE m.noted), suppressed) AS n
        WHERE EXISTS (SELECT 1 FROM moved m WHERE m.noted)
    )
    SELECT CASE WHEN m.id IS NOT NULL OR cur.replayed THEN 'done'
                WHEN cur.found THEN 'lease_lost'
                ELSE 'not_found' END,
           CASE WHEN with_jobs THEN coalesce(m.job, CASE WHEN cur.replayed THEN cur.job END) END,
           r.notified, r.owed
    FROM items i
    LEFT JOIN notes r ON true
    LEFT JOIN moved m ON m.id = i.id AND m.lease_token = i.token
    -- An item that changed nothing reads its job as this statement's snapshot shows it. If the
    -- snapshot still shows the job RUNNING under the item's own token (`stale`), a concurrent
    -- transaction moved it after the snapshot was taken (the UPDATE waited for it, then found no
    -- match): only the latest version tells a replay (COMPLETED under the same token) from a
    -- lost lease, so that one row is read again under a lock, which waits for and returns the
    -- latest version. A row this statement changed is never read so: its items matched it, or
    -- carry another token than the one the snapshot shows. An item that changed its job does
    -- not read it at all: OFFSET 0 keeps this a subquery of its own, where `m.id IS NULL`
    -- gates the probe (a one-time filter per item); pulled up into the join, it was a filter
    -- applied after the probe had fetched the row (tests/integration/test_ack_cost.py).
    LEFT JOIN LATERAL (
        SELECT true AS found, s.state = 'RUNNING' AND s.lease_token = i.token AS stale,
               s.state = 'COMPLETED' AND s.lease_token = i.token AS replayed, s AS job
        FROM evora.jobs s WHERE s.id = i.id AND m.id IS NULL
        OFFSET 0
    ) snap ON true
    LEFT JOIN LATERAL (
        SELECT true AS found, l.state = 'COMPLETED' AND l.lease_token = i.token AS replayed,
               l AS job
        FROM evora.jobs l WHERE l.id = i.id AND snap.stale
        FOR SHARE
    ) latest ON true
    CROSS JOIN LATERAL (
        SELECT CASE WHEN snap.stale THEN latest.found ELSE snap.found END AS found,
               CASE WHEN snap.stale THEN latest.replayed ELSE snap.replayed END AS replayed,
               CASE WHEN snap.stale THEN latest.job ELSE snap.job END AS job
    ) cur
    ORDER BY i.ord;
END
$$;

-- evora.fail_items(): ids, lease tokens, errors ({message, type}), retryable flags, retry-in
-- seconds (NULL: the job's backoff), one of each per item; the queues suppressed and whether
-- to return the jobs, as evora.complete_items(). Fenced per (id, token) like a completion.
-- Cancel wins, then the retry budget: the attempt ends CANCELLED (cancel requested), in the
-- DLQ (not retryable, or no attempts left) or PENDING again after its backoff. One row per
-- item in its own position, like a completion, except that a repeat finds the attempt over: a
-- failure is never replayed, so every item that changed nothing is 'lease_lost', or
-- 'not_found' when no such job exists.
-- An item with a key in `after_keys` reports an upstream's rate limit (docs/flow-control.md,
-- "Upstream retry-after"): its retry-in is the upstream's retry-after. The key's bucket is
-- drained until then (evora.drain_buckets(), for the items whose lease is current), and the
-- attempt is handed back uncounted, as a release is: PENDING again then, event `released`
-- with reason `throttled_upstream` and the error, or CANCELLED if a cancel was requested.
-- This, the `release` and the `expire_leases` statements decide where each attempt goes;
-- moving the rows, recording the events and the NOTIFY hints are evora.end_attempts().
CREATE OR REPLACE FUNCTION evora.fail_items(
    ids uuid[], tokens uuid[], errors jsonb[], retryables boolean[], retry_ins float8[],
    after_keys text[], suppressed text[], with_jobs boolean
) RETURNS TABLE (outcome text, job evora.jobs, notified text[], owed text[])
LANGUAGE plpgsql VOLATILE ROWS 100 SET random_page_cost = 1 AS $$
#variable_conflict use_column
DECLARE
    drains text[];
    untils timestamptz[];
BEGIN
    IF array_remove(after_keys, NULL) <> '{}' THEN
        -- the buckets first, until the time the job's run_at is set to (evora.end_attempts())
        -- The fence's state from a materialized CTE, as in the `heartbeat` statement (the
        -- reason is there; a variable would be a constant in a custom plan).
        WITH fence AS MATERIALIZED (SELECT 'RUNNING'::evora.job_state AS state)
        SELECT array_agg(i.key), array_agg(evora.clock_now() + make_interval(secs => i.retry_in))
        INTO drains, untils
        FROM fence f
        CROSS JOIN unnest(ids, tokens, after_keys, retry_ins) AS i(id, token, key, retry_in)
        JOIN evora.jobs j ON j.id = i.id AND j.lease_token = i.token AND j.state = f.state
        WHERE i.key IS NOT NULL AND j.id = ANY(ids);
        PERFORM evora.drain_buckets(coalesce(drains, '{}'), coalesce(untils, '{}'));
    END IF;
    RETURN QUERY
    WITH items AS (
        SELECT *
        FROM unnest(ids, tokens, errors, retryables, retry_ins, after_keys)
            WITH ORDINALITY AS i(id, token, error, retryable, retry_in, after_key, ord)
    ),
    -- the fence's state comes with the items, for the reason given at evora.complete_items()
    input AS (
        SELECT DISTINCT ON (id, token) *, 'RUNNING'::evora.job_state AS fenced
        FROM items ORDER BY id, token, ord
    ),
    decided AS (
        SELECT ROW(
            j.id,
            CASE WHEN j.cancel_requested THEN 'CANCELLED'
                 WHEN i.after_key IS NOT NULL THEN 'PENDING'
                 WHEN NOT i.retryable OR j.attempt >= j.max_attempts THEN 'DLQ'
                 ELSE 'PENDING' END::evora.job_state,
            i.error,
            CASE WHEN j.cancel_requested THEN 'cancel_requested'
                 WHEN i.after_key IS NOT NULL THEN 'throttled_upstream'
                 WHEN NOT i.retryable THEN 'not_retryable'
                 WHEN j.attempt >= j.max_attempts THEN 'failed' END,
            coalesce(i.retry_in, evora.backoff_seconds(j.backoff_initial, j.backoff_max,
                                                       j.backoff_multiplier, j.attempt)),
            i.after_key IS NOT NULL,
            CASE WHEN i.after_key IS NOT NULL THEN 'released' ELSE 'failed' END, j.worker_id
        )::evora.attempt_end AS decision
        FROM evora.jobs j JOIN input i ON i.id = j.id AND i.token = j.lease_token AND j.state = i.fenced
        -- through the primary key under any plan, as in evora.complete_items()
        WHERE j.id = ANY(ids)
        FOR UPDATE OF j
    ),
    ended AS (
        SELECT * FROM evora.end_attempts(ARRAY(SELECT decision FROM decided), suppressed)
    )
    SELECT CASE WHEN won.ord IS NOT NULL THEN 'done'
                WHEN EXISTS (SELECT 1 FROM evora.jobs x WHERE x.id = i.id) THEN 'lease_lost'
                ELSE 'not_found' END,
           CASE WHEN with_jobs THEN won.job END,
           (SELECT e.notified FROM ended e LIMIT 1),
           (SELECT e.owed FROM ended e LIMIT 1)
    FROM items i
    -- only the first occurrence of the winning (id, token) is the winner
    LEFT JOIN (
        SELECT d.ord, e.job
        FROM ended e JOIN input d ON d.id = (e.job).id AND d.token = (e.job).lease_token
    ) won ON won.ord = i.ord
    ORDER BY i.ord;
END
$$;

-- The signature the previous release's `fail` statement calls: no item reports an upstream's
-- retry-after. Expand/contract: the release after this one drops it (docs/deploy.md,
-- Upgrades).
CREATE OR REPLACE FUNCTION evora.fail_items(
    ids uuid[], tokens uuid[], errors jsonb[], retryables boolean[], retry_ins float8[],
    suppressed text[], with_jobs boolean
) RETURNS TABLE (outcome text, job evora.jobs, notified text[], owed text[])
LANGUAGE sql VOLATILE ROWS 100 AS $$
    SELECT * FROM evora.fail_items(ids, tokens, errors, retryables, retry_ins,
                                   array_fill(NULL::text, ARRAY[cardinality(ids)]), suppressed,
                                   with_jobs)
$$;

-- Completing or failing a job in SQL, inside the worker's own transaction
-- (docs/sql-enqueue.md, "Finishing a job in SQL"): the outcome commits or rolls back with the
-- worker's business data. One item through evora.complete_items() or evora.fail_items(), the
-- functions the dispatcher's acks run, answered by raising where the dispatcher answers 404 or
-- 409: a lost lease (SQLSTATE EV409) or no such job (EV404) aborts the caller's transaction,
-- so business data written under a lease that is no longer the job's never commits. They run
-- as their owner, with the search_path guard of every SECURITY DEFINER function, for the
-- role evora_worker (migration 0034).
CREATE OR REPLACE FUNCTION evora.raise_unless_done(outcome text, job_id uuid) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF outcome = 'lease_lost' THEN
        RAISE EXCEPTION 'job %: the lease token is not the current lease of the job', job_id
            USING ERRCODE = 'EV409',
                  HINT = 'the lease expired or the job was finished under another lease; '
                         'roll back: the job is not yours any more';
    ELSIF outcome = 'not_found' THEN
        RAISE EXCEPTION 'job %: not found', job_id USING ERRCODE = 'EV404';
    END IF;
END
$$;

-- Completes the job; its state, 'COMPLETED' (a repeat with the same token answers the same).
-- A SQL NULL result is stored as JSON null, as an HTTP completion without a result is; a
-- result the dispatcher would refuse (evora.client_json()) raises 22023.
CREATE OR REPLACE FUNCTION evora.complete(job_id uuid, lease_token uuid, result jsonb DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = evora, pg_temp AS $$
BEGIN
    PERFORM evora.raise_unless_done(c.outcome, job_id)
    FROM evora.complete_items(
        ARRAY[job_id], ARRAY[lease_token],
        ARRAY[evora.client_json(coalesce(result, 'null'::jsonb), 'result')], '{}', false) AS c;
    RETURN 'COMPLETED';
END
$$;

-- Fails the attempt; the job's state after it: 'PENDING' (retried after `retry_in_seconds`,
-- or its backoff), 'DLQ' or 'CANCELLED'. `error` is an object like the HTTP failure's:
-- `message` (a string) and optionally `type` and `traceback`. It is stored as the dispatcher
-- stores an HTTP failure (evora.protocol.worker.ErrorBody, storage/jobs.py Failure.error):
-- message and type, and the traceback when given (no other key: `retryable` is an argument
-- of its own here); a failing worker's report
-- is never refused for its length, so a long message keeps its start and a long trace its
-- end (the innermost frames).
-- `retry_after`, `{"limit_key": k, "seconds": n}`, reports an upstream's rate limit
-- (docs/flow-control.md, "Upstream retry-after"): k's bucket is drained for n seconds (at
-- most max_retry_after_seconds) and the job runs again then without using up an attempt
-- ('PENDING'); not with `retry_in_seconds`, nor with `retryable` false.
CREATE OR REPLACE FUNCTION evora.fail(
    job_id uuid, lease_token uuid, error jsonb, retryable boolean DEFAULT true,
    retry_in_seconds float8 DEFAULT NULL, retry_after jsonb DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = evora, pg_temp AS $$
DECLARE
    lim CONSTANT jsonb := evora.limits();
    answer text;
    moved evora.job_state;
    stored jsonb;
    given text;
    after_key text;
    after_seconds float8;
BEGIN
    IF error IS NULL OR jsonb_typeof(error) <> 'object'
            OR jsonb_typeof(error -> 'message') IS DISTINCT FROM 'string' THEN
        PERFORM evora.reject('error', 'must be a JSON object with a string message');
    END IF;
    FOR given IN SELECT jsonb_object_keys(error) LOOP
        IF given NOT IN ('message', 'type', 'traceback') THEN
            PERFORM evora.reject('error.' || given, 'is not a field of an error');
        END IF;
    END LOOP;
    IF coalesce(jsonb_typeof(error -> 'type'), 'null') NOT IN ('string', 'null')
            OR length(error ->> 'type') > (lim ->> 'max_error_type')::integer THEN
        PERFORM evora.reject('error.type', format('must be a string of at most %s characters',
                                                  lim ->> 'max_error_type'));
    END IF;
    IF coalesce(jsonb_typeof(error -> 'traceback'), 'null') NOT IN ('string', 'null') THEN
        PERFORM evora.reject('error.traceback', 'must be a string');
    END IF;
    stored := jsonb_build_object(
        'message', left(error ->> 'message', (lim ->> 'max_error_message')::integer),
        'type', error ->> 'type');
    IF error ->> 'traceback' IS NOT NULL THEN
        stored := stored || jsonb_build_object('traceback', right(
            error ->> 'traceback', (lim ->> 'max_error_traceback')::integer));
    END IF;
    IF retryable IS NULL THEN
        PERFORM evora.reject('retryable', 'must be true or false');
    END IF;
    IF retry_in_seconds IS NOT NULL AND (retry_in_seconds = 'NaN'
            OR retry_in_seconds NOT BETWEEN 0 AND (evora.limits() ->> 'max_seconds')::float8) THEN
        PERFORM evora.reject('retry_in_seconds', format('must be between 0 and %s',
                                                        evora.limits() ->> 'max_seconds'));
    END IF;
    IF retry_after IS NOT NULL AND jsonb_typeof(retry_after) <> 'null' THEN
        IF jsonb_typeof(retry_after) <> 'object' THEN
            PERFORM evora.reject('retry_after', 'must be a JSON object');
        END IF;
        FOR given IN SELECT jsonb_object_keys(retry_after) LOOP
            IF given NOT IN ('limit_key', 'seconds') THEN
                PERFORM evora.reject('retry_after.' || given, 'is not a field of retry_after');
            END IF;
        END LOOP;
        after_key := evora.text_field(retry_after -> 'limit_key', 'retry_after.limit_key',
                                      lim ->> 'limit_key_pattern', NULL, false);
        after_seconds := evora.number_field(
            coalesce(retry_after -> 'seconds', 'null'), 'retry_after.seconds', 0,
            (lim ->> 'max_retry_after_seconds')::numeric, false, true);
        IF retry_in_seconds IS NOT NULL THEN
            PERFORM evora.reject('retry_after', 'give retry_in_seconds or retry_after, not both');
        END IF;
        IF NOT retryable THEN
            PERFORM evora.reject('retry_after', 'a failure that is not retryable is not retried');
        END IF;
    END IF;
    SELECT f.outcome, (f.job).state INTO answer, moved
    FROM evora.fail_items(ARRAY[job_id], ARRAY[lease_token], ARRAY[stored], ARRAY[retryable],
                          ARRAY[coalesce(after_seconds, retry_in_seconds)], ARRAY[after_key],
                          '{}', true) AS f;
    PERFORM evora.raise_unless_done(answer, job_id);
    RETURN moved;
END
$$;

-- Nothing in the evora schema is PUBLIC's (functions/submissions.sql revokes the rest when it
-- runs; this file may run alone); the role evora_worker may call the two entry points.
REVOKE ALL ON FUNCTION evora.complete_items(uuid[], uuid[], jsonb[], text[], boolean),
    evora.fail_items(uuid[], uuid[], jsonb[], boolean[], float8[], text[], boolean),
    evora.fail_items(uuid[], uuid[], jsonb[], boolean[], float8[], text[], text[], boolean),
    evora.raise_unless_done(text, uuid),
    evora.complete(uuid, uuid, jsonb),
    evora.fail(uuid, uuid, jsonb, boolean, float8, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION evora.complete(uuid, uuid, jsonb),
    evora.fail(uuid, uuid, jsonb, boolean, float8, jsonb) TO evora_worker;
