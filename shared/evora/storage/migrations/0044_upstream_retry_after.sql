-- Evora schema, version 44: limits that learn from upstream (docs/flow-control.md, "Upstream
-- retry-after"). A worker that got a rate-limit answer from an upstream reports it with its
-- failure (`retry_after: {limit_key, seconds}`): the key's bucket is drained until then, for
-- every dispatcher, and the job runs again then without using up an attempt.
--
-- `throttled_until` is when the drain ends: the claim finds no room in the key until then
-- (evora.tokens(), functions/flow_limits.sql, answers 0 tokens), whether its limit has a
-- rate or only a concurrency. NULL, or a time passed, for a key no upstream throttled. A
-- nullable column without a default: added without rewriting the table, and the previous
-- release's claims, which read the bucket through evora.tokens(), honour it at once.
ALTER TABLE evora.flow_buckets ADD COLUMN throttled_until timestamptz;
-- The keys ever drained, for the metrics' look at those throttled now (the limits' statement
-- `throttled_limits`): few, where flow_buckets holds a row for every key ever claimed.
CREATE INDEX flow_buckets_throttled ON evora.flow_buckets (throttled_until)
    WHERE throttled_until IS NOT NULL;

-- evora.fail() takes `retry_after` (functions/claims_and_transitions.sql makes it anew with
-- that argument, defaulted): the old signature would make every call with five arguments or
-- fewer ambiguous. Only workers' own transactions call it; no service statement does. (IF
-- EXISTS: on a fresh database the function files have not run yet.)
DROP FUNCTION IF EXISTS evora.fail(uuid, uuid, jsonb, boolean, float8);
