-- Submitting jobs. The rules (idempotency keys, the `submitted` event, the NOTIFY hint) are
-- in evora.store_submissions() (storage/functions/submissions.sql), which applications that
-- submit in SQL reach through evora.submit() and evora.submit_batch().

-- name: submit
-- $1 ids, $2 queues, $3 types, $4 payloads (one JSON array, by item), $5 priorities, $6
-- run_at (NULL: now + delay), $7 delay seconds (NULL: not given), $8 max_attempts, $9
-- lease_seconds, $10 backoff initial, $11 backoff max, $12 backoff multiplier, $13
-- expires_at, $14 idempotency keys, $15 group keys, $16 fingerprints as computed before
-- migration 0011 (see submissions.py), $17 dependency edges: item positions (from 1), $18
-- the jobs they wait for, $19 on_dependency_failure by item, $20 limit keys: item positions
-- (from 1), $21 the keys, $22 max_duration_seconds (NULL: none), $23 fairness keys (NULL:
-- none), $24 debounce keys, $25 their delay_seconds, $26 their max_delay_seconds, $27
-- throttle keys, $28 their window_seconds, $29 suppressed queues (see notify.py), $30 whether
-- to return the jobs. $2, $3, $5-$16, $19 and $22-$28 hold one element per item, or one
-- element that every item shares (evora.for_each_item, functions/submissions.sql). One row per
-- item (`ord` its position, from 1), the created ones first, with its job's `id`; without
-- $25 the whole job is left out (a producer that asked for ids only spares decoding and
-- encoding it).
SELECT ord, outcome, first_ord, (job).id AS id, CASE WHEN $30::bool THEN job END AS job,
       notified, owed
FROM cardinality($1::uuid[]) AS n,
     evora.store_submissions(
         $1::uuid[], evora.for_each_item($2::text[], n), evora.for_each_item($3::text[], n),
         -- one document rather than a jsonb[]: encoded by one call, not one per element
         ARRAY(SELECT p.value::jsonb FROM json_array_elements($4::json) WITH ORDINALITY AS p
               ORDER BY p.ordinality),
         evora.for_each_item($5::int2[], n), evora.for_each_item($6::timestamptz[], n),
         evora.for_each_item($7::float8[], n), evora.for_each_item($8::int4[], n),
         evora.for_each_item($9::int4[], n), evora.for_each_item($10::float8[], n),
         evora.for_each_item($11::float8[], n), evora.for_each_item($12::float8[], n),
         evora.for_each_item($13::timestamptz[], n), evora.for_each_item($14::text[], n),
         evora.for_each_item($15::text[], n), evora.for_each_item($16::bytea[], n), $29::text[],
         $17::int4[], $18::uuid[], evora.for_each_item($19::text[], n), $20::int4[],
         $21::text[], evora.for_each_item($22::int4[], n), evora.for_each_item($23::text[], n),
         evora.for_each_item($24::text[], n), evora.for_each_item($25::float8[], n),
         evora.for_each_item($26::float8[], n), evora.for_each_item($27::text[], n),
         evora.for_each_item($28::float8[], n));
