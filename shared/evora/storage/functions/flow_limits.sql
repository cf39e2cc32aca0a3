-- Flow-control limits (docs/flow-control.md): the limit governing a key, what holds it, the
-- tokens of its bucket. The limited claim is in claims_and_transitions.sql.
--
-- The current text of this area's functions and triggers: edit them here. `evora migrate`
-- runs the file again whole, so every statement is re-runnable (CONTRIBUTING.md says how).

-- The limit that governs each of `keys`: its own, else the longest prefix limit whose stem it
-- starts with; keys no limit governs are left out. The keys' own limits in one index scan;
-- the prefix limits (few) read once, not once per key, so a key costs nothing when none
-- exists.
CREATE OR REPLACE FUNCTION evora.governing_limits(keys text[])
RETURNS TABLE (key text, concurrency integer, rate_limit integer, rate_per_seconds float8)
LANGUAGE sql STABLE AS $$
    SELECT e.key, e.concurrency, e.rate_limit, e.rate_per_seconds
    FROM evora.flow_limits e
    WHERE e.key = ANY(keys)
    UNION ALL
    (SELECT DISTINCT ON (k.key) k.key, p.concurrency, p.rate_limit, p.rate_per_seconds
     FROM (SELECT * FROM evora.flow_limits WHERE stem IS NOT NULL) AS p
     JOIN unnest(keys) AS k(key) ON starts_with(k.key, p.stem)
     WHERE NOT EXISTS (SELECT 1 FROM evora.flow_limits e WHERE e.key = k.key)
     ORDER BY k.key, length(p.stem) DESC)
$$;

-- How many RUNNING jobs hold `k`, by this statement's snapshot.
CREATE OR REPLACE FUNCTION evora.running_holding(k text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM evora.jobs r
            WHERE starts_with(k, 'queue:') AND r.state = 'RUNNING' AND r.queue = substr(k, 7))
         + (SELECT count(*) FROM evora.jobs r
            WHERE r.state = 'RUNNING' AND r.limit_keys <> '{}' AND r.limit_keys @> ARRAY[k]
              AND NOT (starts_with(k, 'queue:') AND r.queue = substr(k, 7)))
$$;

-- The max_pending (admission control, docs/flow-control.md "Admission") that applies to
-- each of `keys`: that of the limit governing the key (its own, else the longest prefix
-- limit's), when it has one; other keys are left out. A key whose own limit has no
-- max_pending is not governed by a prefix limit's. evora.governing_limits()'s rule: not
-- that function with a column more, because the previous release's statements call it
-- (`SELECT *` included) while they are rolled, and only submissions need this one.
CREATE OR REPLACE FUNCTION evora.admission_limits(keys text[])
RETURNS TABLE (key text, max_pending integer)
LANGUAGE sql STABLE AS $$
    SELECT g.key, g.max_pending
    FROM (SELECT e.key, e.max_pending
          FROM evora.flow_limits e
          WHERE e.key = ANY(keys)
          UNION ALL
          (SELECT DISTINCT ON (k.key) k.key, p.max_pending
           FROM (SELECT * FROM evora.flow_limits WHERE stem IS NOT NULL) AS p
           JOIN unnest(keys) AS k(key) ON starts_with(k.key, p.stem)
           WHERE NOT EXISTS (SELECT 1 FROM evora.flow_limits e WHERE e.key = k.key)
           ORDER BY k.key, length(p.stem) DESC)) AS g
    WHERE g.max_pending IS NOT NULL
$$;

-- How many jobs holding `k` wait to run (PENDING or WAITING), by this statement's snapshot,
-- counting at most `most` of each kind of holder (NULL: all): admission only needs to know
-- whether there are more than max_pending, and reads no further (index-only for
-- `queue:<q>`, through jobs_listing_by_id; jobs_waiting_limit_keys for the other keys).
CREATE OR REPLACE FUNCTION evora.pending_holding(k text, most bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM (
                SELECT 1 FROM evora.jobs p
                WHERE starts_with(k, 'queue:') AND p.state IN ('PENDING', 'WAITING')
                  AND p.queue = substr(k, 7)
                LIMIT most) AS q)
         + (SELECT count(*) FROM (
                SELECT 1 FROM evora.jobs p
                WHERE p.state IN ('PENDING', 'WAITING') AND p.limit_keys <> '{}'
                  AND p.limit_keys @> ARRAY[k]
                  AND NOT (starts_with(k, 'queue:') AND p.queue = substr(k, 7))
                LIMIT most) AS l)
$$;

-- Up to `most` due PENDING jobs holding `k` (a job of queue q holds `queue:q`, and each key
-- its limit_keys name), each once, with when it became due: the held back of a key without
-- room that the usages count (storage/sql/limits.sql). Bounded by `most`, never by the
-- backlog: those of `queue:<q>` read through jobs_claimable a priority at a time, those
-- naming `k` through jobs_waiting_limit_keys (tests/integration/test_generic_plans.py).
CREATE OR REPLACE FUNCTION evora.due_holding(k text, most bigint)
RETURNS TABLE (id uuid, run_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT c.id, c.run_at FROM (
        SELECT q.id, q.run_at FROM (
            SELECT s.id, s.run_at
            FROM evora.pending_priorities(
                CASE WHEN starts_with(k, 'queue:') THEN ARRAY[substr(k, 7)] ELSE '{}' END) AS p
            CROSS JOIN LATERAL (
                SELECT j.id, j.run_at FROM evora.jobs j
                WHERE j.state = 'PENDING' AND j.queue = p.queue AND j.priority = p.priority
                  AND j.run_at <= evora.clock_now()
                ORDER BY j.run_at
                LIMIT most
            ) AS s
            LIMIT most
        ) AS q
        UNION
        SELECT n.id, n.run_at FROM (
            SELECT j.id, j.run_at FROM evora.jobs j
            WHERE j.state = 'PENDING' AND j.limit_keys <> '{}' AND j.limit_keys @> ARRAY[k]
              AND j.run_at <= evora.clock_now()
            LIMIT most
        ) AS n
    ) AS c
    LIMIT most
$$;

-- A bucket's tokens at `at`: refilled at limit / per_seconds a second, capped at limit; none
-- while an upstream throttles the key (`throttled_until`, evora.drain_buckets()), even
-- without a rate (NULL otherwise): the claim's room in a key is the least of its concurrency
-- left and its tokens, so a key limited by concurrency alone is held back too.
CREATE OR REPLACE FUNCTION evora.tokens(b evora.flow_buckets, rate_limit integer, rate_per_seconds float8,
                             at timestamptz)
RETURNS float8
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN b.throttled_until > at THEN 0::float8
                ELSE least(rate_limit::float8,
                           b.tokens + greatest(0, extract(epoch FROM at - b.refilled_at))
                                      * rate_limit / rate_per_seconds) END
$$;

-- Limits that learn from upstream (docs/flow-control.md, "Upstream retry-after"): an upstream
-- answered a worker "not before `untils`" for `keys` (by position; a key named twice keeps its
-- latest time). The bucket of each key a concurrency or rate limit governs is drained until
-- then: no tokens, refilled from that time on, and `throttled_until` that time, so no claim
-- of any dispatcher admits a job holding the key before it (evora.tokens()). A drain never
-- shortens an earlier, longer one. Keys no such limit governs are left alone: no claim reads
-- their bucket.
--
-- A bucket row is changed as a claim changes it: a missing one is made under the claim's
-- advisory lock of the key ('EVOR'), so a claim making the same row never waits for this
-- insert (it finds the lock taken and skips the key); this waits for a claim instead, which
-- lasts milliseconds. Keys are locked in key order, so two drains cannot deadlock; claims
-- never wait for a lock, so a drain cannot deadlock with one either.
CREATE OR REPLACE FUNCTION evora.drain_buckets(keys text[], untils timestamptz[])
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    making CONSTANT integer := 1163284306;  -- 'EVOR', as evora.claim_limited()
    d record;
BEGIN
    FOR d IN
        SELECT u.key, max(u.until) AS until
        FROM unnest(keys, untils) AS u(key, until)
        JOIN evora.governing_limits(keys) g ON g.key = u.key
        WHERE g.concurrency IS NOT NULL OR g.rate_limit IS NOT NULL
        GROUP BY u.key
        ORDER BY u.key
    LOOP
        PERFORM pg_advisory_xact_lock(making, hashtext(d.key));
        INSERT INTO evora.flow_buckets AS b (key, tokens, refilled_at, throttled_until)
        VALUES (d.key, 0, d.until, d.until)
        ON CONFLICT (key) DO UPDATE
        SET tokens = 0,
            refilled_at = greatest(b.refilled_at, excluded.refilled_at),
            throttled_until = greatest(b.throttled_until, excluded.throttled_until);
    END LOOP;
END
$$;

-- Every change of a limit (put, replace, delete), kept in flow_limit_changes (migration 0028)
-- with the transaction's time, so the auditor judges each claim by the limit in force when
-- it began (docs/audit.md). A row trigger, so whatever changes flow_limits (the api, an
-- operator's SQL) is recorded; limits change rarely, so it costs nothing on a hot path.
CREATE OR REPLACE FUNCTION evora.record_limit_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO evora.flow_limit_changes (key, deleted) VALUES (OLD.key, true);
    ELSE
        INSERT INTO evora.flow_limit_changes (key, concurrency, rate_limit, rate_per_seconds,
                                              max_pending, deleted)
        VALUES (NEW.key, NEW.concurrency, NEW.rate_limit, NEW.rate_per_seconds, NEW.max_pending,
                false);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER flow_limits_history
    AFTER INSERT OR UPDATE OR DELETE ON evora.flow_limits
    FOR EACH ROW EXECUTE FUNCTION evora.record_limit_change();
