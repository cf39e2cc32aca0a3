-- Fair scheduling across fairness keys (docs/flow-control.md, "Fairness keys"): the claim of
-- a queue that has keyed jobs, the weights, and the ledger the other paths append to.
--
-- The current text of this area's functions: edit them here. `evora migrate` runs the file
-- again whole, so every statement is re-runnable (CONTRIBUTING.md says how).
--
-- Start-time fair queuing over virtual time, per queue: each key has a virtual finish
-- `vfinish`; a job of key k claimed now starts at S = max(V, vfinish_k) (V: the queue's
-- virtual time, so a key that had no backlog comes back at V, with no credit saved up) and
-- moves vfinish_k to S + est_k / weight_k, est_k being the lease time the key's attempts are
-- expected to hold. When the attempt ends, the key is charged what it really held instead
-- (the difference, over its weight): a tenant of slow jobs pays for the time it keeps
-- workers, not for the number of its dispatches. The claim serves the smallest start tags.

-- The weight of a key: its own, else the longest prefix's (`tenant:*` weighs every key under
-- `tenant:` alike, each on its own), else 1.
CREATE OR REPLACE FUNCTION evora.fairness_weight(fkey text) RETURNS float8
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT w.weight FROM evora.fairness_weights w WHERE w.key = fkey),
        (SELECT w.weight FROM evora.fairness_weights w
         WHERE w.stem IS NOT NULL AND starts_with(fkey, w.stem)
         ORDER BY length(w.stem) DESC LIMIT 1),
        1::float8)
$$;

-- Which weight applies to a key: the key's own row, else the longest prefix's (`tenant:*`),
-- else NULL (the default, 1); the row evora.fairness_weight() takes its weight from.
CREATE OR REPLACE FUNCTION evora.fairness_weight_set_by(fkey text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT w.key FROM evora.fairness_weights w WHERE w.key = fkey),
        (SELECT w.key FROM evora.fairness_weights w
         WHERE w.stem IS NOT NULL AND starts_with(fkey, w.stem)
         ORDER BY length(w.stem) DESC LIMIT 1))
$$;

-- Records, without a lock, that keyed jobs of `queues`/`fkeys` became PENDING or WAITING
-- (`ended` 0) or ended attempts that held their leases `held` seconds in all: one ledger row
-- per (queue, key), folded by the queue's next fair claim. A keyed job submitted to a queue
-- makes it fair (its row in fair_queues; ON CONFLICT DO NOTHING waits only for a concurrent
-- first insert of the same queue).
CREATE OR REPLACE FUNCTION evora.fair_note(queues text[], fkeys text[], ended integer[],
                                           held float8[])
RETURNS void
LANGUAGE sql AS $$
    WITH noted AS (
        INSERT INTO evora.fair_ledger (queue, key, ended, held)
        SELECT u.queue, u.key, sum(u.ended), sum(u.held)
        FROM unnest(queues, fkeys, ended, held) AS u(queue, key, ended, held)
        WHERE u.key IS NOT NULL
        GROUP BY u.queue, u.key
        RETURNING queue
    )
    INSERT INTO evora.fair_queues (queue)
    SELECT DISTINCT n.queue FROM noted n
    ORDER BY 1
    ON CONFLICT (queue) DO NOTHING
$$;

-- Folds the ledger of queue `q` into its keys; the caller holds the queue's row lock, so no
-- other fold or claim of the queue runs meanwhile. A key with new work is backlogged again
-- (new: it starts at the queue's virtual time). An ended attempt takes back what the claim
-- charged in advance for it (the average of what is outstanding, so that all charges of a
-- key add up to exactly the lease time its attempts held) and charges what it held, over the
-- key's weight now; the estimate follows what attempts held (a moving average).
CREATE OR REPLACE FUNCTION evora.fair_fold(q text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    folded_keys text[];
    folded_ended bigint[];
    folded_held float8[];
    v float8;
BEGIN
    WITH gone AS (
        DELETE FROM evora.fair_ledger l WHERE l.queue = q RETURNING l.key, l.ended, l.held
    )
    SELECT array_agg(g.key ORDER BY g.key), array_agg(g.n ORDER BY g.key),
           array_agg(g.seconds ORDER BY g.key)
    INTO folded_keys, folded_ended, folded_held
    FROM (SELECT o.key, sum(o.ended) AS n, sum(o.held) AS seconds FROM gone o GROUP BY o.key)
        AS g;
    IF folded_keys IS NULL THEN
        RETURN;
    END IF;
    SELECT f.vtime INTO v FROM evora.fair_queues f WHERE f.queue = q;
    INSERT INTO evora.fair_keys (queue, key, vfinish)
    SELECT q, u.key, v FROM unnest(folded_keys) AS u(key)
    ON CONFLICT (queue, key) DO UPDATE SET backlogged = true;
    -- (what was charged in advance for n of the key's `running` attempts: n times their
    -- average, `outstanding / running`)
    UPDATE evora.fair_keys k
    SET vfinish = k.vfinish + (u.held - least(u.ended, k.running)
                                        * (k.outstanding / greatest(k.running, 1)))
                              / evora.fairness_weight(k.key),
        outstanding = k.outstanding - least(u.ended, k.running)
                                      * (k.outstanding / greatest(k.running, 1)),
        running = k.running - least(u.ended, k.running),
        est = k.est * power(0.8, u.ended) + (u.held / u.ended) * (1 - power(0.8, u.ended)),
        held_seconds = k.held_seconds + u.held
    FROM unnest(folded_keys, folded_ended, folded_held) AS u(key, ended, held)
    WHERE k.queue = q AND k.key = u.key AND u.ended > 0;
END
$$;

-- The fair choice of queue `q`, shared by both claims that serve a fair queue (evora.claim_fair()
-- and, under limits, evora.claim_limited()); the caller holds the queue's fair_queues row lock and
-- has folded its ledger, so the virtual times it reads are final until it commits. The `need`
-- backlogged keys with the smallest virtual finish among those with a claimable job holding none of
-- the limit keys `blocked` (fair_keys_turn, each key probed through jobs_fair_backlog), up to
-- `need` jobs of each in the key's own order (priority, run_at, submission), the i-th at start tag
-- S + (i-1) * cost, S = max(V, vfinish); the `need` smallest tags win. (Keys beyond the first
-- `need` cannot have a smaller tag: each of the first `need` offers its first job at or below
-- theirs.) Priorities order a key's own jobs, not the keys. The winners are locked without waiting
-- (an older release's unkeyed claim may hold one; a row held is left out, not replaced) and
-- returned in tag order, each with its key's `start` S and `cost` (what evora.fair_charge() needs
-- for the jobs actually claimed).
--
-- The keys the walk read and passed over (no claimable job) whose jobs are all gone leave it
-- in the same statement (`unwalked`), unless they owe virtual time (their finish is ahead of
-- the queue's): a key with no backlog keeps no credit, but keeps its debt. Only the keys
-- before the walk's last: checking every backlogged key would cost each claim as many probes
-- as the queue has keys. A key passed over for its blocked jobs has jobs, and stays. A key
-- whose job became PENDING or WAITING after this snapshot has a ledger row this claim did not
-- fold (it committed with the job): the next claim marks the key again. (The trim was a
-- statement of its own, after the charge, with the walk's end as a filter that a generic plan
-- did not use in its index scan: it read every backlogged key at or below V, every claim;
-- docs/benchmarks/2026-11-29-fair-claim-cost.md.) PL/pgSQL, as evora.fair_charge() below, so
-- that its plans are prepared once per connection, as they were inside evora.claim_fair().
CREATE OR REPLACE FUNCTION evora.fair_pick(q text, at timestamptz, types text[], need integer,
                                           blocked text[])
RETURNS TABLE (key text, start float8, cost float8, tag float8, id uuid, priority smallint,
               run_at timestamptz, submit_seq bigint, limit_keys text[])
LANGUAGE plpgsql VOLATILE ROWS 10 AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH cand AS MATERIALIZED (
        SELECT k.key, k.vfinish,
               greatest(k.vfinish, (SELECT f.vtime FROM evora.fair_queues f WHERE f.queue = q))
                   AS s,
               k.est / evora.fairness_weight(k.key) AS cost
        FROM evora.fair_keys k
        -- A scalar subquery, not EXISTS: the planner answered EXISTS for every key at once,
        -- hashing every PENDING job of the queue and sorting every key (20 ms a claim with
        -- 2,500 keys); a scalar subquery is never hashed, so the walk reads fair_keys_turn in
        -- order, one probe of jobs_fair_backlog per key, and stops at the `need`-th key with
        -- work.
        WHERE k.queue = q AND k.backlogged
          AND (SELECT true FROM evora.jobs j
               WHERE j.queue = q AND j.fairness_key = k.key
                 AND evora.claimable(j, q, at, types) AND {{rule:group_turn}}
                 AND NOT (j.limit_keys && blocked)
               LIMIT 1)
        ORDER BY k.vfinish, k.key
        LIMIT need
    ),
    offered AS (
        SELECT c.key, c.s, c.cost, c.s + (x.n - 1) * c.cost AS tag, x.id, x.priority,
               x.run_at, x.submit_seq, x.limit_keys
        FROM cand c
        CROSS JOIN LATERAL (
            SELECT j.id, j.priority, j.run_at, j.submit_seq, j.limit_keys,
                   row_number() OVER (ORDER BY j.priority, j.run_at, j.submit_seq) AS n
            FROM evora.jobs j
            WHERE j.queue = q AND j.fairness_key = c.key
              AND evora.claimable(j, q, at, types) AND {{rule:group_turn}}
              AND NOT (j.limit_keys && blocked)
            ORDER BY j.priority, j.run_at, j.submit_seq
            LIMIT need
        ) AS x
    ),
    chosen AS MATERIALIZED (
        SELECT o.* FROM offered o ORDER BY o.tag, o.priority, o.run_at, o.submit_seq
        LIMIT need
    ),
    -- by `= ANY(ARRAY(...))`, a probe of the primary key per job (as `IN (SELECT ...)` the
    -- planner may hash-join every job of the table to them)
    locked AS MATERIALIZED (
        SELECT j.id FROM evora.jobs j
        WHERE j.id = ANY(ARRAY(SELECT c.id FROM chosen c)) AND j.state = 'PENDING'
        FOR UPDATE OF j SKIP LOCKED
    ),
    -- where the walk ended: the last key it read, or all of them ('infinity' and NULL, which
    -- every (vfinish, key) is below)
    walked AS MATERIALIZED (
        SELECT CASE WHEN (SELECT count(*) FROM cand) < need THEN 'infinity'
                    ELSE (SELECT c.vfinish FROM cand c ORDER BY c.vfinish DESC, c.key DESC
                          LIMIT 1) END AS finish,
               CASE WHEN (SELECT count(*) FROM cand) >= need
                    THEN (SELECT c.key FROM cand c ORDER BY c.vfinish DESC, c.key DESC
                          LIMIT 1) END AS key
    ),
    -- the bound as scalar subqueries, not a join: a condition of the index scan on
    -- fair_keys_turn (joined to `walked`, the planner read every key of the queue)
    unwalked AS (
        UPDATE evora.fair_keys k SET backlogged = false
        WHERE k.queue = q AND k.backlogged
          AND (k.vfinish, k.key) < ((SELECT w.finish FROM walked w), (SELECT w.key FROM walked w))
          AND NOT EXISTS (SELECT 1 FROM evora.jobs j
                          WHERE j.queue = q AND j.fairness_key = k.key
                            AND j.state IN ('PENDING', 'WAITING'))
          -- (the queue's virtual time once this choice is served)
          AND k.vfinish <= greatest((SELECT f.vtime FROM evora.fair_queues f WHERE f.queue = q),
                                    (SELECT max(c.tag) FROM chosen c))
    )
    SELECT c.key, c.s, c.cost, c.tag, c.id, c.priority, c.run_at, c.submit_seq, c.limit_keys
    FROM chosen c
    JOIN locked l ON l.id = c.id
    ORDER BY c.tag, c.priority, c.run_at, c.submit_seq;
END
$$;

-- Charges the keys for the jobs a fair claim moved to RUNNING (one element per job: its
-- queue, key, and its key's start and cost as evora.fair_pick() offered them): n jobs of a
-- key move its virtual finish to S + n * cost and charge it n estimates in advance (settled
-- by the fold as the attempts end); the queue's virtual time moves to the largest start tag
-- served. Only claimed jobs are charged: a job the choice offered that was held by another
-- transaction or refused by a limit costs its key nothing. The caller holds the queues' row
-- locks.
CREATE OR REPLACE FUNCTION evora.fair_charge(queues text[], fkeys text[], starts float8[],
                                             costs float8[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WITH served AS MATERIALIZED (
        SELECT u.queue, u.key, count(*) AS n, min(u.start) AS start, min(u.cost) AS cost
        FROM unnest(queues, fkeys, starts, costs) AS u(queue, key, start, cost)
        GROUP BY u.queue, u.key
    ),
    charged AS (
        UPDATE evora.fair_keys k
        SET vfinish = s.start + s.n * s.cost, running = k.running + s.n,
            outstanding = k.outstanding + s.n * k.est, served = k.served + s.n
        FROM served s
        WHERE k.queue = s.queue AND k.key = s.key
    )
    UPDATE evora.fair_queues f SET vtime = greatest(f.vtime, s.last)
    FROM (SELECT s.queue, max(s.start + (s.n - 1) * s.cost) AS last FROM served s
          GROUP BY s.queue) AS s
    WHERE f.queue = s.queue;
END
$$;

-- The claim of queues some of which are fair (the `claim` statement calls it while any of
-- its queues has a row in fair_queues and no concurrency or rate limit exists; with limits,
-- evora.claim_limited() serves fair queues by the same choice): up to `wanted` jobs, queue by
-- queue in name order, moved by evora.claim_jobs() as every claim's. A queue without fair
-- scheduling is claimed as the unlimited claim claims it.
--
-- A fair queue's claims are serialised by its fair_queues row (FOR UPDATE, waiting: a claim
-- holds it for milliseconds), and every statement after the lock takes a new snapshot in
-- which every earlier claim of the queue is committed: the choice of keys is exact however
-- many dispatchers claim at once (a claim that read the keys' virtual times before the lock
-- was granted would serve a key another claim had just served; tests/integration/
-- test_fairness.py holds a claim open to prove it is not so). Submissions and attempt endings
-- only append to the ledger: they never wait for a claim, nor a claim for them.
--
-- Choosing: evora.fair_pick(), charged for what it returned (all of it is claimed). Jobs
-- without a key in a fair queue fill what the keys leave, oldest first.
CREATE OR REPLACE FUNCTION evora.claim_fair(queues text[], types text[], wanted integer,
                                            worker text)
RETURNS TABLE (job evora.jobs, dependency_results jsonb)
LANGUAGE plpgsql ROWS 1 AS $$
DECLARE
    q text;
    taken integer := 0;
    need integer;
    at timestamptz;
    fair boolean;
    picked_keys text[];
    starts float8[];
    costs float8[];
    ids uuid[];
    unkeyed uuid[];
    v float8;
    tags jsonb;
BEGIN
    FOR q IN SELECT DISTINCT u.queue FROM unnest(queues) AS u(queue) ORDER BY 1 LOOP
        need := wanted - taken;
        EXIT WHEN need <= 0;
        SELECT f.vtime INTO v FROM evora.fair_queues f WHERE f.queue = q FOR UPDATE;
        fair := FOUND;
        -- the clock as of the lock (a claim may have waited for it), the tests' offset kept
        at := evora.clock_now() + (clock_timestamp() - now());
        IF fair THEN
            PERFORM evora.fair_fold(q);
            SELECT coalesce(array_agg(p.id), '{}'), array_agg(p.key), array_agg(p.start),
                   array_agg(p.cost),
                   jsonb_object_agg(p.id, jsonb_build_object('tag', p.tag, 'vtime', v))
            INTO ids, picked_keys, starts, costs, tags
            FROM evora.fair_pick(q, at, types, need, '{}') AS p;
            PERFORM evora.fair_charge(array_fill(q, ARRAY[cardinality(ids)]), picked_keys,
                                      starts, costs);
            -- each job's start tag and the virtual time it was chosen at, for its `claimed`
            -- event (evora.claim_jobs())
            PERFORM set_config('evora.fair_tags', coalesce(tags::text, ''), true);
        ELSE
            ids := '{}';
        END IF;
        IF cardinality(ids) < need THEN
            unkeyed := ARRAY(
                SELECT j.id FROM evora.jobs j
                WHERE evora.claimable(j, q, at, types) AND {{rule:group_turn}}
                  AND j.fairness_key IS NULL AND NOT (j.id = ANY(ids))
                ORDER BY j.priority, j.run_at, j.submit_seq
                LIMIT need - cardinality(ids)
                FOR UPDATE OF j SKIP LOCKED);
            ids := ids || unkeyed;
        END IF;
        RETURN QUERY SELECT * FROM evora.claim_jobs(ids, NULL, worker, at);
        PERFORM set_config('evora.fair_tags', '', true);
        taken := taken + cardinality(ids);
    END LOOP;
END
$$;
