-- Dependencies (docs/dependencies.md): a WAITING job is released or cancelled by the
-- transaction that ends its last dependency, through the triggers on jobs below.
--
-- The current text of this area's functions and triggers: edit them here. `evora migrate`
-- runs the file again whole, so every statement is re-runnable (CONTRIBUTING.md says how).

-- What a WAITING dependent becomes when `arrived` of its dependencies have just ended
-- (COMPLETED or CANCELLED), one of them CANCELLED if `cancelled`: the one statement of the
-- readiness rule.
CREATE OR REPLACE FUNCTION evora.dependent_next_state(j evora.jobs, arrived integer, cancelled boolean)
RETURNS evora.job_state
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        -- (NULL is 'cancel': migration 0067)
        WHEN cancelled AND j.on_dependency_failure IS DISTINCT FROM 'run' THEN 'CANCELLED'::evora.job_state
        WHEN j.dependencies_left <= arrived THEN 'PENDING'::evora.job_state
        ELSE 'WAITING'::evora.job_state
    END
$$;

-- What the jobs `ended_ids` (each now in its state of `ended_states`, COMPLETED or
-- CANCELLED) change below them: every WAITING job that waits on one of them, with the state
-- it moves to, how many of its dependencies ended (`arrived`) and, for one cancelled, the
-- CANCELLED dependency that cancels it (`cause`). A job cancelled so ends too: the jobs
-- waiting on it are in the answer as well, down the whole subtree.
CREATE OR REPLACE FUNCTION evora.settlement(ended_ids uuid[], ended_states evora.job_state[])
RETURNS TABLE (id uuid, state evora.job_state, arrived integer, cause uuid)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE cancelled(id) AS (
        SELECT d.job_id
        FROM unnest(ended_ids, ended_states) AS e(id, state)
        JOIN evora.job_dependencies d ON d.depends_on = e.id
        JOIN evora.jobs w ON w.id = d.job_id
        WHERE e.state = 'CANCELLED' AND w.state = 'WAITING'
          AND evora.dependent_next_state(w, 0, true) = 'CANCELLED'
        UNION
        SELECT d.job_id
        FROM cancelled c
        JOIN evora.job_dependencies d ON d.depends_on = c.id
        JOIN evora.jobs w ON w.id = d.job_id
        WHERE w.state = 'WAITING' AND evora.dependent_next_state(w, 0, true) = 'CANCELLED'
    ),
    ended AS (
        SELECT e.id, e.state FROM unnest(ended_ids, ended_states) AS e(id, state)
        UNION ALL
        SELECT c.id, 'CANCELLED'::evora.job_state FROM cancelled c
    ),
    arrivals AS (
        SELECT d.job_id AS id, count(*)::integer AS arrived,
               (array_agg(e.id ORDER BY e.id) FILTER (WHERE e.state = 'CANCELLED'))[1] AS cause
        FROM ended e
        JOIN evora.job_dependencies d ON d.depends_on = e.id
        GROUP BY d.job_id
    )
    SELECT w.id, evora.dependent_next_state(w, a.arrived, a.cause IS NOT NULL), a.arrived,
           a.cause
    FROM arrivals a
    JOIN evora.jobs w ON w.id = a.id
    WHERE w.state = 'WAITING'
$$;

-- A submission's hold on the dependencies of the job it is about to store: locks them in id
-- order (racing submissions then cannot deadlock), marks them as having dependents, and
-- returns their current state, committed before the lock was granted. A dependency cannot
-- finish until the submission commits, and then its trigger sees the new edges.
CREATE OR REPLACE FUNCTION evora.hold_dependencies(ids uuid[]) RETURNS TABLE (id uuid, state evora.job_state)
LANGUAGE sql AS $$
    WITH held AS (
        SELECT x.id FROM evora.jobs x WHERE x.id = ANY(ids) ORDER BY x.id FOR NO KEY UPDATE
    )
    UPDATE evora.jobs j SET has_dependents = true
    FROM held h
    WHERE j.id = h.id
    RETURNING j.id, j.state
$$;

-- The WAITING jobs that depend on `dependency`, as the calling statement's snapshot shows
-- them. A set-returning SQL function of one query: the planner inlines it where it is
-- called in FROM, so `EXISTS (SELECT 1 FROM evora.waiting_dependents(f.id))` plans exactly
-- as the EXISTS written out, a probe of job_dependencies_dependents per job asked about.
-- (A boolean function around the EXISTS would not be inlined: a call per job.)
CREATE OR REPLACE FUNCTION evora.waiting_dependents(dependency uuid) RETURNS SETOF uuid
LANGUAGE sql STABLE AS $$
    SELECT d.job_id FROM evora.job_dependencies d JOIN evora.jobs w ON w.id = d.job_id
    WHERE d.depends_on = dependency AND w.state = 'WAITING'
$$;

-- Waiting jobs are settled once per statement, for every job it ended that others wait on,
-- whatever their number and order in the statement (an ack batch completes many): all the
-- waiting jobs that will change are locked first, in one global order (id), so two
-- transactions ending dependencies of the same jobs queue on the same first row instead of
-- deadlocking. (Settling row by row as each dependency ends would take the same rows in
-- different orders in two batches.) A statement with a fresh snapshot, which sees every
-- decrement committed before the locks were granted, then settles the whole subtree at once.
--
-- An AFTER UPDATE row trigger notes each job the statement ends that others wait on, in
-- settings local to the transaction; its WHEN clause passes over every other row in C. The
-- AFTER UPDATE statement trigger settles them; it returns at once from every statement that
-- noted none. While it settles, `evora.settling` keeps the jobs it cancels from being noted:
-- the settlement already covered what waits on them.
-- No BEFORE row trigger: with one on the table, every UPDATE of jobs locks its row before
-- changing it, a WAL record per row (guards.sql says more). The note fires after the rows
-- are updated, but before the statement trigger: a statement's AFTER events fire in the order
-- they were queued, and the statement trigger's is queued when the UPDATE has done its rows.
-- For the same reason the statement trigger has no WHEN clause: an AFTER trigger's WHEN is
-- evaluated when its event is queued, before any note has been made.
--
-- A note appends the id to `evora.ended_dependencies`, and setting a value copies it whole,
-- so that setting is kept short: once it holds 8 kB (222 ids) it moves to
-- `evora.ended_dependencies_<n>`, `evora.ended_dependency_chunks` counting them, and a
-- statement ending n jobs copies O(n) bytes. (One setting holding every id copied O(n^2):
-- bench.cancel_fanout, loaded machine, 2026-11-29, a cancel of 10,000 children 2.65 s,
-- 50,000 past the 30 s statement timeout; in chunks 0.58-1.39 s and 5.3-5.8 s, the rest of
-- the cancel now the larger part.) Measured beside it: an insert per id into a temporary
-- table (1.25 s, 10.96 s; and a table in every pooled session) or an unlogged table keyed
-- by transaction (2.27 s, 8.98 s; and its dead rows to vacuum). A statement trigger with
-- transition tables would need no list of ids, but PostgreSQL refuses them on a trigger
-- with a column list (`UPDATE OF state`), so every update of jobs, heartbeats and claims
-- included, would copy its rows into them. (bench.heartbeats with such a trigger: 262
-- and 379 against 286 and 291 us of PostgreSQL CPU per heartbeat, within the loaded
-- machine's noise; the cost is not measurable there, but it is not nothing.) A session
-- keeps the chunk settings it created, emptied at the end of each transaction: as many as
-- its largest statement needed, not one more per transaction.
CREATE OR REPLACE FUNCTION evora.note_ended_dependency() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    noted text := coalesce(current_setting('evora.ended_dependencies', true), '');
    full_chunks integer;
BEGIN
    IF octet_length(noted) >= 8192 THEN
        full_chunks := coalesce(nullif(current_setting('evora.ended_dependency_chunks', true),
                                       ''), '0')::integer + 1;
        PERFORM set_config('evora.ended_dependencies_' || full_chunks, noted, true);
        PERFORM set_config('evora.ended_dependency_chunks', full_chunks::text, true);
        noted := '';
    END IF;
    PERFORM set_config('evora.ended_dependencies', noted || NEW.id || ',', true);
    RETURN NULL;  -- an AFTER trigger's result is not used
END
$$;

-- The ids evora.note_ended_dependency() noted since the last call, its chunks and the
-- current setting in one text, read once; all emptied (a long transaction does not keep
-- them). The settlement's first step.
CREATE OR REPLACE FUNCTION evora.take_ended_dependencies() RETURNS uuid[]
LANGUAGE plpgsql AS $$
DECLARE
    full_chunks CONSTANT integer := coalesce(
        nullif(current_setting('evora.ended_dependency_chunks', true), ''), '0')::integer;
    noted text;
BEGIN
    SELECT string_agg(current_setting('evora.ended_dependencies_' || n), '' ORDER BY n)
    INTO noted
    FROM generate_series(1, full_chunks) AS n;
    noted := concat(noted, current_setting('evora.ended_dependencies'));
    PERFORM set_config('evora.ended_dependencies_' || n, '', true)
    FROM generate_series(1, full_chunks) AS n;
    PERFORM set_config('evora.ended_dependency_chunks', '', true);
    PERFORM set_config('evora.ended_dependencies', '', true);
    RETURN string_to_array(rtrim(noted, ','), ',')::uuid[];
END
$$;

-- The AFTER UPDATE statement trigger's function (see evora.note_ended_dependency above): locks
-- every WAITING job that will change in id order, then settles the whole subtree with a fresh
-- snapshot, writes their events and the NOTIFY hint of each queue that gained a PENDING job.
-- `SET random_page_cost = 1`, as on evora.claim_jobs() (the reason is there): a connection
-- keeps the plans of its statements, and one made while jobs was small read the table whole
-- on every later settlement (7,289 rows to discard one job with one dependent beside 1,200
-- others, tests/integration/test_plan_traps.py); planned afresh on a table without
-- statistics, the WAITING jobs of evora.settlement() were still a sequential scan (2,435).
CREATE OR REPLACE FUNCTION evora.settle_dependents() RETURNS trigger
LANGUAGE plpgsql SET random_page_cost = 1 AS $$
DECLARE
    ended_ids uuid[];
    ended_states evora.job_state[];
    hinted bigint;
BEGIN
    IF coalesce(current_setting('evora.ended_dependencies', true), '') = '' THEN
        RETURN NULL;
    END IF;
    -- Parsed once, before the query: as an expression of it (current_setting() is only
    -- STABLE) a plan scanning the jobs parsed the whole list again for every row, quadratic
    -- in the jobs a statement ends (a cancel of a parent's 3,000 children took 6.5 s here).
    ended_ids := evora.take_ended_dependencies();
    SELECT array_agg(j.id ORDER BY j.id), array_agg(j.state ORDER BY j.id)
    INTO ended_ids, ended_states
    FROM evora.jobs j
    WHERE j.id = ANY(ended_ids);

    PERFORM 1
    FROM evora.jobs j
    WHERE j.id IN (SELECT s.id FROM evora.settlement(ended_ids, ended_states) s)
    ORDER BY j.id
    FOR UPDATE OF j;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;

    PERFORM set_config('evora.settling', 'on', true);
    WITH settled AS (
        UPDATE evora.jobs j
        SET state = n.state,
            dependencies_left = CASE WHEN n.state = 'CANCELLED' THEN j.dependencies_left
                                     ELSE j.dependencies_left - n.arrived END,
            version = j.version + (n.state <> 'WAITING')::int,
            updated_at = CASE WHEN n.state <> 'WAITING' THEN evora.clock_now() ELSE j.updated_at END,
            finished_at = CASE WHEN n.state = 'CANCELLED' THEN evora.clock_now() END
        FROM evora.settlement(ended_ids, ended_states) n
        WHERE j.id = n.id AND j.state = 'WAITING'
        RETURNING j.*, n.cause, evora.event_image(j, 'WAITING') AS image
    ),
    -- One row per statement (evora.event_batches, migration 0064); its data NULL when no
    -- job was cancelled.
    recorded AS (
        INSERT INTO evora.event_batches (seqs, at, job_ids, job_versions, queues, types, events,
                                         from_states, to_states, attempts, worker_ids, data,
                                         jobs)
        SELECT evora.next_seqs(count(*)), updated_at, array_agg(id), array_agg(version),
               array_agg(queue), array_agg(type),
               array_agg(CASE WHEN state = 'PENDING' THEN 'dependencies_met' ELSE 'cancelled' END),
               array_fill('WAITING'::evora.job_state, ARRAY[count(*)::int]), array_agg(state),
               array_agg(attempt), array_fill(NULL::text, ARRAY[count(*)::int]),
               CASE WHEN bool_or(state = 'CANCELLED') THEN
                   array_agg(CASE WHEN state = 'CANCELLED'
                                  THEN jsonb_build_object('reason', 'dependency_cancelled',
                                                          'dependency', cause)
                                  ELSE '{}'::jsonb END) END,
               array_agg(image)
        FROM settled
        WHERE state <> 'WAITING'
        GROUP BY updated_at
    )
    -- The NOTIFY hint, as for any job that becomes PENDING (delivered at commit).
    SELECT count(pg_notify('evora_jobs', q.queue))
    INTO hinted
    FROM (SELECT DISTINCT queue FROM settled WHERE state = 'PENDING') q;
    PERFORM set_config('evora.settling', '', true);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER jobs_note_ended_dependency
    AFTER UPDATE OF state ON evora.jobs
    FOR EACH ROW
    WHEN (NEW.has_dependents AND NEW.state IN ('COMPLETED', 'CANCELLED')
          AND OLD.state IS DISTINCT FROM NEW.state
          AND current_setting('evora.settling', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION evora.note_ended_dependency();

CREATE OR REPLACE TRIGGER jobs_settle_dependents
    AFTER UPDATE OF state ON evora.jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION evora.settle_dependents();

-- Children awaited without holding a slot (docs/jobs-that-wait.md): the RUNNING job `parent`,
-- which the caller holds locked (its lease checked) in the transaction that has just stored
-- `children`, now waits for them. They become its dependencies (edges, and the end of its
-- `depends_on`, so its next claim carries their results as `dependency_results`), and it
-- leaves RUNNING as a snooze does: no lease, no limit slot (those are RUNNING's), no FIFO
-- group turn (a WAITING job holds none: children of the same group could never run while
-- it did), its attempt handed back uncounted. It moves to what the readiness rule
-- (evora.dependent_next_state) says of the children that have ended already: WAITING for the
-- rest, or PENDING when none is left (replayed idempotency keys named only ended jobs); event
-- `awaiting_children` either way. `on_failure` NULL keeps the job's own.
-- A child already CANCELLED under on_dependency_failure 'cancel' is refused, as a submission
-- naming one is (the job could never run): outcome 'cancelled_dependency' with that child
-- (`cause`), nothing changed here, for the caller to roll back.
-- The children are held as a submission holds its dependencies (evora.hold_dependencies: in
-- id order, marked as having dependents): a child that a concurrent transaction is ending
-- (a replayed key's job completed right now) is waited for and counted as ended, and one that
-- ends after this commits sees the edge and the WAITING parent, so the parent neither waits
-- for a child that already ended nor misses one. A child named twice, or already one of the
-- parent's dependencies, counts once. One row: the outcome ('done' or
-- 'cancelled_dependency'), the job as it now is, the queues notified and owed
-- (evora.record_moves).
CREATE OR REPLACE FUNCTION evora.await_children(
    parent uuid, children uuid[], on_failure text, suppressed text[]
) RETURNS TABLE (outcome text, cause uuid, job evora.jobs, notified text[], owed text[])
LANGUAGE plpgsql VOLATILE ROWS 1 AS $$
DECLARE
    at CONSTANT timestamptz := evora.clock_now();
    j evora.jobs;
    fresh uuid[];
    named integer;
    arrived integer;
    cancelled uuid;
    next evora.job_state;
BEGIN
    SELECT x.* INTO j FROM evora.jobs x WHERE x.id = parent AND x.state = 'RUNNING';
    fresh := ARRAY(
        SELECT u.id FROM unnest(children) WITH ORDINALITY AS u(id, n)
        WHERE u.id <> ALL(coalesce(j.depends_on, '{}'))
        GROUP BY u.id ORDER BY min(u.n));
    SELECT count(*)::integer,
           (count(*) FILTER (WHERE h.state IN ('COMPLETED', 'CANCELLED')))::integer,
           (array_agg(h.id ORDER BY h.id) FILTER (WHERE h.state = 'CANCELLED'))[1]
    INTO named, arrived, cancelled
    FROM evora.hold_dependencies(fresh) AS h;
    j.on_dependency_failure := nullif(coalesce(on_failure, j.on_dependency_failure), 'cancel');
    j.dependencies_left := named;
    next := evora.dependent_next_state(j, arrived, cancelled IS NOT NULL);
    IF next = 'CANCELLED' THEN
        RETURN QUERY SELECT 'cancelled_dependency', cancelled, NULL::evora.jobs, NULL::text[],
                            NULL::text[];
        RETURN;
    END IF;
    INSERT INTO evora.job_dependencies (job_id, depends_on)
    SELECT parent, c FROM unnest(fresh) AS c;
    UPDATE evora.jobs x
    SET state = next,
        attempt = x.attempt - 1,
        on_dependency_failure = j.on_dependency_failure,
        depends_on = coalesce(x.depends_on, '{}') || fresh,
        dependencies_left = named - arrived,
        lease_expires_at = NULL,
        run_at = CASE WHEN next = 'PENDING' THEN at ELSE x.run_at END,
        updated_at = at, version = x.version + 1
    WHERE x.id = parent AND x.state = 'RUNNING'
    RETURNING x.* INTO j;
    RETURN QUERY SELECT 'done', NULL::uuid, j, r.notified, r.owed
    FROM evora.record_moves(
        ARRAY[ROW(j, 'awaiting_children', 'RUNNING', j.worker_id,
                  jsonb_build_object('children', cardinality(fresh),
                                     'waiting_for', j.dependencies_left))::evora.move],
        suppressed) AS r;
END
$$;

-- What a cancel of `parent` cancels with it (docs/jobs-that-wait.md, "Cancelling a waiting
-- job"): the children its spawns created (evora.spawned_children, migration 0057), their
-- own, and so on, that have not ended. A child is shared, and runs on with its own children,
-- when a WAITING job other than its parent and that parent's other children waits for it
-- (a later spawn or submission that named it). The jobs a child's idempotency key replayed
-- are not its parent's: never recorded, never cancelled.
-- Read by one index probe of `spawned_children` per job of the tree, because migration 0058
-- has the planner expect a row or so per parent: estimated from the statistics (thousands
-- per parent after a few large spawns) it compared every job of the tree with every row.
-- Whether a job waiting for a child is one of its siblings is one probe of the primary key,
-- (parent, child), both known: a scalar subquery, which the planner runs as it is written.
-- As `NOT IN` the family's children (a hashed subplan, built again for each child a sibling
-- waits for) or as `NOT EXISTS` (pulled up into an anti-join that probes by parent alone,
-- which 0058 estimates at a row), each child a sibling waits for read the whole family: a
-- chain of n siblings, n^2 rows.
CREATE OR REPLACE FUNCTION evora.spawned_tree(parent uuid) RETURNS SETOF uuid
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE tree (id) AS (
        SELECT parent
        UNION
        SELECT s.child FROM tree t JOIN evora.spawned_children s ON s.parent = t.id
        WHERE NOT EXISTS (
            SELECT 1 FROM evora.waiting_dependents(s.child) AS w(id)
            WHERE w.id <> s.parent
              AND (SELECT o.child FROM evora.spawned_children o
                   WHERE o.parent = s.parent AND o.child = w.id) IS NULL)
    )
    SELECT j.id FROM tree t JOIN evora.jobs j ON j.id = t.id
    WHERE t.id <> parent AND j.state IN ('PENDING', 'WAITING', 'RUNNING', 'SUSPENDED')
$$;

-- Locks `parent` and its tree (evora.spawned_tree()) for their cancel; returns the tree's ids
-- (in id order: evora.cancel_held() probes the primary key by `= ANY(ids)`, which sorts the
-- array for each probe, and a sorted one costs a pass).
-- The order of the locks is the one every transition keeps when it locks several jobs: the
-- jobs that are not WAITING first, then the WAITING ones, each by id. An ending holds its
-- jobs (never WAITING, locked by id when they are a batch of acks) and then, settling, locks
-- the WAITING jobs that wait for them, by id (evora.settle_dependents()). A tree orders its
-- jobs otherwise: a parent waits for its children, which are newer (larger ids), and one
-- batch's ids share their millisecond and are random below it, so a sibling that waits for
-- another may have the smaller id. Locked by id (the parent last), a cancel held a WAITING
-- child and waited for its RUNNING child, whose completion waited for the WAITING one: a
-- deadlock (tests/integration/test_lock_order.py builds it, and the others this order
-- closes). Nor deepest first: a batch of acks holding a child and a cousin's child (two
-- depths, both RUNNING) takes them by id. `parent` is locked with them, not after: a cancel
-- of a job inside another's tree then takes the jobs both lock in the same order. `=
-- ANY(ARRAY(...))`: a probe of the primary key per job under any plan, as evora.cancel_job()
-- says. A statement of its own, so a new snapshot: the tree as committed when it is read.
CREATE OR REPLACE FUNCTION evora.hold_spawned_tree(parent uuid) RETURNS uuid[]
LANGUAGE sql VOLATILE AS $$
    WITH held AS (
        SELECT j.id FROM evora.jobs j
        WHERE j.id = ANY(ARRAY(SELECT evora.spawned_tree(parent)) || parent)
        ORDER BY j.state = 'WAITING', j.id
        FOR UPDATE
    )
    SELECT coalesce(array_agg(h.id ORDER BY h.id) FILTER (WHERE h.id <> parent), '{}')
    FROM held h
$$;
