-- Submitting jobs. The rules (idempotency keys, the `submitted` event, the NOTIFY hint) are
-- in evora.submit_rows() (migrations/0011_submit_in_sql.sql), which applications that
-- submit in SQL reach through evora.submit() and evora.submit_batch().

-- name: submit
-- $1 ids, $2 queues, $3 types, $4 payloads, $5 priorities, $6 run_at (NULL: now + delay),
-- $7 delay seconds (NULL: not given), $8 max_attempts, $9 lease_seconds, $10 backoff
-- initial, $11 backoff max, $12 backoff multiplier, $13 expires_at, $14 idempotency keys,
-- $15 group keys, $16 fingerprints as computed before migration 0011 (see
-- submissions.py), $17 suppressed queues (see notify.py), $18 whether to return the jobs.
-- One row per item (`ord` its position, from 1), the created ones first, with its job's
-- `id`; without $18 the whole job is left out (a producer that asked for ids only spares
-- decoding and encoding it).
SELECT ord, outcome, first_ord, (job).id AS id, CASE WHEN $18::bool THEN job END AS job,
       notified, owed
FROM evora.submit_rows($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::int2[],
                       $6::timestamptz[], $7::float8[], $8::int4[], $9::int4[], $10::float8[],
                       $11::float8[], $12::float8[], $13::timestamptz[], $14::text[],
                       $15::text[], $16::bytea[], $17::text[]);
