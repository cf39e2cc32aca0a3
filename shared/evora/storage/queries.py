"""Every SQL statement the job store issues, by name.

Each state change is ONE statement (rule 1): a CTE chain that picks rows under lock, updates
them guarded by their expected state (and lease token), and inserts exactly one
`job_events` row per changed job. A lost race matches no row and so writes no event.
`_transition` appends the shared tail (event insert, optional NOTIFY) so the event shape
is written once.

Positional parameters are documented per statement; arrays are passed for set-based
operations so a batch is one round trip.
"""

from __future__ import annotations

from evora.storage.notify import JOBS_CHANNEL

# Columns every changing CTE named `moved` returns beside the job row, describing its event.
_EVENT_COLUMNS = "evora_job_image(j) AS image"


# The columns of `jobs`: what a transition hands back by default (the event's columns, the
# image above all, are for the outbox, not the caller).
JOB_COLUMNS = (
    "id",
    "submit_seq",
    "queue",
    "type",
    "payload",
    "state",
    "priority",
    "group_key",
    "idempotency_key",
    "attempt",
    "max_attempts",
    "lease_seconds",
    "backoff_initial",
    "backoff_max",
    "backoff_multiplier",
    "run_at",
    "expires_at",
    "lease_token",
    "lease_expires_at",
    "worker_id",
    "cancel_requested",
    "result",
    "last_error",
    "progress",
    "version",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
)


def _transition(
    prelude: str,
    change: str,
    *,
    suppress_param: int | None = None,
    columns: tuple[str, ...] = JOB_COLUMNS,
) -> str:
    """Wrap `change` (an UPDATE/INSERT aliased `j` returning `j.*`, the image and the
    `ev_name`, `ev_from`, `ev_worker`, `ev_data` columns) into the full statement, which
    returns `columns` of each changed job.

    With `suppress_param`, queues that may have a newly claimable job are notified (a job
    became PENDING, or a grouped job changed, which can free its group's next job), except
    those in that text[] parameter (recently notified by this process); the statement
    returns the notified queues in column `notified` and the ones it left out in `owed`."""
    with_clause = f"WITH {prelude},\n" if prelude else "WITH "
    notify = ""
    notified_column = ""
    if suppress_param is not None:
        notify = f""",
claimable AS (
    SELECT DISTINCT queue AS q FROM moved WHERE state = 'PENDING' OR group_key IS NOT NULL
),
notified AS (
    SELECT q, pg_notify('{JOBS_CHANNEL}', q) AS sent
    FROM claimable
    WHERE q <> ALL(${suppress_param}::text[])
)"""
        notified_column = (
            ", (SELECT array_agg(q) FROM notified) AS notified"
            f", (SELECT array_agg(q) FROM claimable WHERE q = ANY(${suppress_param}::text[]))"
            " AS owed"
        )
    return f"""{with_clause}moved AS (
{change}
),
recorded AS (
    INSERT INTO job_events (job_id, job_version, queue, type, event, from_state, to_state,
                            attempt, worker_id, at, data, job)
    SELECT id, version, queue, type, ev_name, ev_from, state,
           attempt, ev_worker, updated_at, ev_data, image
    FROM moved
){notify}
SELECT {", ".join(f"moved.{c}" for c in columns)}{notified_column} FROM moved"""


# $1 ids, $2 queues, $3 types, $4 payloads, $5 priorities, $6 run_at (NULL: now + delay),
# $7 delay seconds, $8 max_attempts, $9 lease_seconds, $10 backoff initial, $11 backoff max,
# $12 backoff multiplier, $13 expires_at, $14 idempotency keys, $15 group keys,
# $16 fingerprints, $17 suppressed queues.
# Keyed items are inserted only if their key is new; ON CONFLICT waits for a concurrent
# holder of the same key to commit, so exactly one of any racing submissions creates a job.
SUBMIT = _transition(
    """input AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::int2[],
                         $6::timestamptz[], $7::float8[], $8::int4[], $9::int4[],
                         $10::float8[], $11::float8[], $12::float8[], $13::timestamptz[],
                         $14::text[], $15::text[], $16::bytea[])
        WITH ORDINALITY AS i(id, queue, type, payload, priority, run_at, delay, max_attempts,
                             lease_seconds, backoff_initial, backoff_max, backoff_multiplier,
                             expires_at, idempotency_key, group_key, fingerprint, ord)
),
keyed AS (
    INSERT INTO idempotency_keys (queue, key, fingerprint, job_id)
    SELECT queue, idempotency_key, fingerprint, id FROM input
    WHERE idempotency_key IS NOT NULL
    -- one lock order for every batch, so racing batches cannot deadlock on their keys
    ORDER BY queue, idempotency_key
    ON CONFLICT (queue, key) DO NOTHING
    RETURNING job_id
)""",
    """    INSERT INTO jobs AS j (id, queue, type, payload, priority, run_at, max_attempts,
                           lease_seconds, backoff_initial, backoff_max, backoff_multiplier,
                           expires_at, idempotency_key, group_key)
    SELECT id, queue, type, payload, priority,
           coalesce(run_at, now() + make_interval(secs => delay)), max_attempts,
           lease_seconds, backoff_initial, backoff_max, backoff_multiplier,
           expires_at, idempotency_key, group_key
    FROM input
    WHERE idempotency_key IS NULL OR id IN (SELECT job_id FROM keyed)
    ORDER BY ord
    RETURNING j.*, """
    + _EVENT_COLUMNS
    + """, 'submitted' AS ev_name, NULL::job_state AS ev_from,
              NULL::text AS ev_worker, '{}'::jsonb AS ev_data""",
    suppress_param=17,
)

# $1 queues, $2 keys: the idempotency records (and their jobs, if not pruned) for replays.
IDEMPOTENT_REPLAYS = """
SELECT k.queue AS key_queue, k.key AS key_name, k.fingerprint, k.job_id AS key_job_id, j.*
FROM unnest($1::text[], $2::text[]) AS x(queue, key)
JOIN idempotency_keys k ON k.queue = x.queue AND k.key = x.key
LEFT JOIN jobs j ON j.id = k.job_id
"""

# $1 queues, $2 types (NULL: any), $3 max jobs, $4 worker id.
# Per queue, take the first claimable jobs in (priority, run_at, submission) order, skipping
# paused queues and rows other claimers hold. A grouped job is claimable only as the head of
# its (queue, group) (lowest priority, then submission order, due or not, so a retrying head
# keeps its place) and only while no job of its group runs.
CLAIM = _transition(
    """picked AS (
    SELECT c.id
    FROM unnest($1::text[]) AS q(queue)
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at, j.submit_seq
        FROM jobs j
        WHERE j.state = 'PENDING' AND j.queue = q.queue AND j.run_at <= now()
          AND (j.expires_at IS NULL OR j.expires_at > now() OR j.started_at IS NOT NULL)
          AND ($2::text[] IS NULL OR j.type = ANY($2::text[]))
          AND (j.group_key IS NULL OR (
                NOT EXISTS (
                    SELECT 1 FROM jobs r
                    WHERE r.state = 'RUNNING' AND r.queue = j.queue AND r.group_key = j.group_key)
                AND NOT EXISTS (
                    SELECT 1 FROM jobs e
                    WHERE e.state = 'PENDING' AND e.queue = j.queue AND e.group_key = j.group_key
                      AND (e.priority, e.submit_seq) < (j.priority, j.submit_seq))))
        ORDER BY j.priority, j.run_at, j.submit_seq
        LIMIT $3
        FOR UPDATE OF j SKIP LOCKED
    ) AS c
    WHERE NOT EXISTS (SELECT 1 FROM paused_queues p WHERE p.queue = q.queue)
    ORDER BY c.priority, c.run_at, c.submit_seq
    LIMIT $3
)""",
    """    UPDATE jobs j
    SET state = 'RUNNING', attempt = j.attempt + 1, lease_token = gen_random_uuid(),
        lease_expires_at = now() + make_interval(secs => j.lease_seconds), worker_id = $4,
        started_at = now(), updated_at = now(), version = j.version + 1
    -- picked holds these rows locked and re-checked as PENDING; repeating the state here
    -- would only tempt the planner into scanning the pending index for them
    FROM picked WHERE j.id = picked.id
    RETURNING j.*, """
    + _EVENT_COLUMNS
    + """, 'claimed' AS ev_name, 'PENDING'::job_state AS ev_from,
              j.worker_id AS ev_worker, '{}'::jsonb AS ev_data""",
)

# $1 id, $2 lease token, $3 lease seconds (NULL: the job's own), $4 progress (NULL: keep).
# A heartbeat is not a transition: no version bump, no event.
HEARTBEAT = """
UPDATE jobs
SET lease_expires_at = now() + make_interval(secs => coalesce($3::int4, lease_seconds)),
    progress = coalesce($4::jsonb, progress)
WHERE id = $1 AND lease_token = $2 AND state = 'RUNNING'
RETURNING lease_expires_at, cancel_requested
"""

# Acks arrive in batches (one /v1/acks request, or concurrent single requests coalesced),
# and a batch may name a job more than once: a stale worker's token beside the owner's, or
# the owner's retry. Items are therefore kept per (id, token), never merged per id: only the
# item carrying the current lease token can match its job, whatever else the batch holds,
# and a repeat of the same (id, token) keeps its first occurrence. The changed rows come
# back with their lease token, so the caller answers each item by (id, token) too.
ACK_COLUMNS = ("id", "lease_token")

# $1 ids, $2 lease tokens, $3 results, $4 suppressed queues.
_COMPLETE = (
    """input AS (
    SELECT DISTINCT ON (id, token) *
    FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[]) WITH ORDINALITY AS i(id, token, result, ord)
    ORDER BY id, token, ord
)""",
    """    UPDATE jobs j
    SET state = 'COMPLETED', result = i.result, lease_expires_at = NULL, finished_at = now(),
        updated_at = now(), version = j.version + 1
    FROM input i WHERE j.id = i.id AND j.lease_token = i.token AND j.state = 'RUNNING'
    RETURNING j.*, """
    + _EVENT_COLUMNS
    + """, 'completed' AS ev_name, 'RUNNING'::job_state AS ev_from,
              j.worker_id AS ev_worker,
              jsonb_build_object('result_bytes', pg_column_size(i.result)) AS ev_data""",
)
COMPLETE = _transition(*_COMPLETE, suppress_param=4)
# The same, answering only which (job, lease) pairs it completed (all a batch of acks reports).
COMPLETE_IDS = _transition(*_COMPLETE, suppress_param=4, columns=ACK_COLUMNS)

# Where a RUNNING job goes when its attempt ends without success. `d` must provide
# id, to_state, reason, delay, error, worker, released (attempt not counted) and, from the
# locked job row, the attempt and run_at it had.
_END_ATTEMPT = (
    """    UPDATE jobs j
    SET state = d.to_state,
        -- a release hands the claim back uncounted, unless it ends the job (cancel requested):
        -- then the attempt ran and stays counted
        attempt = j.attempt - CASE WHEN d.released AND d.to_state = 'PENDING' THEN 1 ELSE 0 END,
        last_error = coalesce(d.error, j.last_error),
        lease_expires_at = NULL,
        run_at = CASE WHEN d.to_state = 'PENDING'
                      THEN now() + make_interval(secs => d.delay) ELSE j.run_at END,
        finished_at = CASE WHEN d.to_state = 'PENDING' THEN NULL ELSE now() END,
        updated_at = now(), version = j.version + 1
    FROM decided d WHERE j.id = d.id AND j.state = 'RUNNING'
    RETURNING j.*, """
    + _EVENT_COLUMNS
    + """,
        CASE WHEN d.to_state = 'CANCELLED' THEN 'cancelled'
             WHEN d.to_state = 'DLQ' THEN 'dead_lettered'
             ELSE d.pending_event END AS ev_name,
        'RUNNING'::job_state AS ev_from, d.worker AS ev_worker,
        (SELECT coalesce(jsonb_object_agg(key, value), '{}')
         FROM jsonb_each(jsonb_build_object(
             'error', d.error, 'reason', d.reason,
             'retry_at', CASE WHEN d.to_state = 'PENDING' THEN j.run_at END))
         WHERE value <> 'null') AS ev_data"""
)

# The decision shared by fail and lease expiry: cancel wins, then the retry budget.
_OUTCOME = """
        CASE WHEN j.cancel_requested THEN 'CANCELLED'
             WHEN {dead} OR j.attempt >= j.max_attempts THEN 'DLQ'
             ELSE 'PENDING' END::job_state AS to_state,
        CASE WHEN j.cancel_requested THEN 'cancel_requested'
             WHEN {dead} THEN '{dead_reason}'
             WHEN j.attempt >= j.max_attempts THEN '{exhausted_reason}' END AS reason"""

_BACKOFF = (
    "evora_backoff_seconds(j.backoff_initial, j.backoff_max, j.backoff_multiplier, j.attempt)"
)

# $1 ids, $2 lease tokens, $3 errors ({message, type}), $4 retryable flags,
# $5 retry-in seconds (NULL: the job's backoff), $6 suppressed queues.
_FAIL = (
    """input AS (
    SELECT DISTINCT ON (id, token) *
    FROM unnest($1::uuid[], $2::uuid[], $3::jsonb[], $4::bool[], $5::float8[])
        WITH ORDINALITY AS i(id, token, error, retryable, retry_in, ord)
    ORDER BY id, token, ord
),
decided AS (
    SELECT j.id, i.error, j.worker_id AS worker, false AS released, 'failed' AS pending_event,"""
    + _OUTCOME.format(
        dead="NOT i.retryable", dead_reason="not_retryable", exhausted_reason="failed"
    )
    + f""",
        coalesce(i.retry_in, {_BACKOFF}) AS delay
    FROM jobs j JOIN input i ON i.id = j.id AND i.token = j.lease_token
    WHERE j.state = 'RUNNING'
    FOR UPDATE OF j
)""",
    _END_ATTEMPT,
)
FAIL = _transition(*_FAIL, suppress_param=6)
FAIL_IDS = _transition(*_FAIL, suppress_param=6, columns=ACK_COLUMNS)

# $1 id, $2 lease token, $3 delay seconds, $4 suppressed queues.
# A released claim does not count as an attempt.
RELEASE = _transition(
    """decided AS (
    SELECT j.id, NULL::jsonb AS error, j.worker_id AS worker, true AS released,
           'released' AS pending_event,
           CASE WHEN j.cancel_requested THEN 'CANCELLED' ELSE 'PENDING' END::job_state
               AS to_state,
           CASE WHEN j.cancel_requested THEN 'cancel_requested' END AS reason,
           $3::float8 AS delay
    FROM jobs j
    WHERE j.id = $1 AND j.lease_token = $2 AND j.state = 'RUNNING'
    FOR UPDATE OF j
)""",
    _END_ATTEMPT,
    suppress_param=4,
)

# $1 batch size, $2 suppressed queues. Sweeper: leases that ran out. SKIP LOCKED and the
# re-checked `lease_expires_at < now()` fence it against a heartbeat or completion that wins.
EXPIRE_LEASES = _transition(
    """decided AS (
    -- recorded as the attempt's error (unless the job is being cancelled anyway), so a job
    -- dead-lettered this way says why; one fixed message, so failure statistics count every
    -- expiry as one reason
    SELECT j.id,
           CASE WHEN NOT j.cancel_requested THEN jsonb_build_object(
               'message', 'the lease expired before the worker reported an outcome',
               'type', 'lease_expired') END AS error,
           j.worker_id AS worker, false AS released, 'lease_expired' AS pending_event,"""
    + _OUTCOME.format(dead="false", dead_reason="", exhausted_reason="lease_expired")
    + f""",
        {_BACKOFF} AS delay
    FROM jobs j
    WHERE j.state = 'RUNNING' AND j.lease_expires_at < now()
    ORDER BY j.lease_expires_at
    LIMIT $1
    FOR UPDATE OF j SKIP LOCKED
)""",
    _END_ATTEMPT,
    suppress_param=2,
)

# $1 batch size, $2 suppressed queues. Sweeper: PENDING jobs whose expires_at passed before
# they started. A job that started and waits for a retry is past its TTL's reach.
EXPIRE_TTLS = _transition(
    """due AS (
    SELECT id FROM jobs
    WHERE state = 'PENDING' AND expires_at IS NOT NULL AND started_at IS NULL
      AND expires_at <= now()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)""",
    """    UPDATE jobs j
    SET state = 'DLQ', finished_at = now(), updated_at = now(), version = j.version + 1
    FROM due WHERE j.id = due.id AND j.state = 'PENDING'
    RETURNING j.*, """
    + _EVENT_COLUMNS
    + """, 'dead_lettered' AS ev_name, 'PENDING'::job_state AS ev_from,
              NULL::text AS ev_worker, '{"reason": "expired"}'::jsonb AS ev_data""",
    suppress_param=2,
)

# $1 id, $2 suppressed queues. A PENDING job is cancelled at once; a RUNNING job gets
# cancel_requested (once) and its worker decides. Anything else matches nothing: a DLQ job
# leaves the DLQ only by an admin's retry or discard.
CANCEL = _transition(
    """target AS (
    SELECT id, state FROM jobs
    WHERE id = $1 AND (state = 'PENDING' OR (state = 'RUNNING' AND NOT cancel_requested))
    FOR UPDATE
)""",
    """    UPDATE jobs j
    SET state = CASE WHEN t.state = 'RUNNING' THEN j.state ELSE 'CANCELLED' END,
        cancel_requested = (t.state = 'RUNNING'),
        finished_at = CASE WHEN t.state = 'RUNNING' THEN NULL ELSE now() END,
        updated_at = now(), version = j.version + 1
    FROM target t WHERE j.id = t.id AND j.state = t.state
    RETURNING j.*, """
    + _EVENT_COLUMNS
    + """,
        CASE WHEN t.state = 'RUNNING' THEN 'cancel_requested' ELSE 'cancelled' END AS ev_name,
        t.state AS ev_from, j.worker_id AS ev_worker, '{}'::jsonb AS ev_data""",
    suppress_param=2,
)

# DLQ -> PENDING with a fresh attempt budget; `target` picks the rows. A time-to-live that
# already ran out is dropped: the operator asked for the job to run.
_RETRY_DLQ = (
    """    UPDATE jobs j
    SET state = 'PENDING', attempt = 0, run_at = now(), finished_at = NULL,
        expires_at = CASE WHEN j.expires_at <= now() THEN NULL ELSE j.expires_at END,
        lease_expires_at = NULL, updated_at = now(), version = j.version + 1
    FROM target t WHERE j.id = t.id AND j.state = 'DLQ'
    RETURNING j.*, """
    + _EVENT_COLUMNS
    + """, 'retried' AS ev_name, 'DLQ'::job_state AS ev_from,
              NULL::text AS ev_worker, '{}'::jsonb AS ev_data"""
)

# $1 id, $2 suppressed queues.
RETRY = _transition(
    "target AS (SELECT id FROM jobs WHERE id = $1 AND state = 'DLQ' FOR UPDATE)",
    _RETRY_DLQ,
    suppress_param=2,
)

# $1 queue, $2 type (NULL: any), $3 batch size, $4 suppressed queues.
REDRIVE = _transition(
    """target AS (
    SELECT id FROM jobs
    WHERE queue = $1 AND state = 'DLQ' AND ($2::text IS NULL OR type = $2)
    ORDER BY submit_seq
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)""",
    _RETRY_DLQ,
    suppress_param=4,
)

# $1 id, $2 suppressed queues.
DISCARD = _transition(
    "target AS (SELECT id FROM jobs WHERE id = $1 AND state = 'DLQ' FOR UPDATE)",
    """    UPDATE jobs j
    SET state = 'CANCELLED', finished_at = now(), updated_at = now(), version = j.version + 1
    FROM target t WHERE j.id = t.id AND j.state = 'DLQ'
    RETURNING j.*, """
    + _EVENT_COLUMNS
    + """, 'cancelled' AS ev_name, 'DLQ'::job_state AS ev_from,
              NULL::text AS ev_worker, '{"reason": "discarded"}'::jsonb AS ev_data""",
    suppress_param=2,
)

GET_JOB = "SELECT * FROM jobs WHERE id = $1"

# $1 ids: the current state of jobs whose transition matched nothing, to tell the caller why.
JOB_STATES = "SELECT id, state, lease_token FROM jobs WHERE id = ANY($1::uuid[])"

PAUSE_QUEUE = "INSERT INTO paused_queues (queue) VALUES ($1) ON CONFLICT DO NOTHING"

RESUME_QUEUE = f"""
WITH resumed AS (DELETE FROM paused_queues WHERE queue = $1 RETURNING queue)
SELECT count(pg_notify('{JOBS_CHANNEL}', queue)) FROM resumed
"""

# $1 queues: the trailing hints a writer owes for changes it did not announce (notify.py).
NOTIFY_QUEUES = f"SELECT pg_notify('{JOBS_CHANNEL}', q) FROM unnest($1::text[]) AS q"

PAUSED_QUEUES = "SELECT queue FROM paused_queues WHERE queue = ANY($1::text[])"

ALL_PAUSED_QUEUES = "SELECT queue FROM paused_queues ORDER BY queue"

# $1 queues: seconds until the earliest future run_at (by the database's clock, so a
# dispatcher's own clock cannot skew it), so a dispatcher can sleep exactly until then.
NEXT_DUE = """
SELECT extract(epoch FROM min(n.run_at) - now())::float8
FROM unnest($1::text[]) AS q(queue)
CROSS JOIN LATERAL (
    SELECT run_at FROM jobs
    WHERE state = 'PENDING' AND queue = q.queue AND run_at > now()
    ORDER BY run_at
    LIMIT 1
) AS n
"""

JOB_EVENTS = """
SELECT seq, job_id, queue, type, event, from_state, to_state, attempt, worker_id, at, data
FROM job_events WHERE job_id = $1 ORDER BY job_version
"""

_LIST_FILTERS = {"queue": "queue = ${}", "state": "state = ${}::job_state", "type": "type = ${}"}


def list_jobs(filters: tuple[str, ...], *, after: bool) -> str:
    """Newest-first keyset page. One statement per filter combination, so each gets a plan
    that uses its index instead of a generic plan full of `$n IS NULL OR ...`."""
    clauses = []
    for position, name in enumerate(filters, start=1):
        clauses.append(_LIST_FILTERS[name].format(position))
    limit = len(filters) + 1
    if after:
        clauses.append(f"submit_seq < ${limit + 1}")
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    return f"SELECT * FROM jobs {where} ORDER BY submit_seq DESC LIMIT ${limit}"


# Outbox tail (rule 5). $1 after-xid (text), $2 after-seq, $3 limit. Only transactions older
# than every still-running one are read, so nothing that commits later can land behind the
# cursor.
READ_OUTBOX = """
SELECT xid::text::int8 AS xid, seq, job_id, job_version, queue, type, event, from_state,
       to_state, attempt, worker_id, at, data, job
FROM job_events
WHERE (xid, seq) > ($1::text::xid8, $2::int8)
  AND xid < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY xid, seq
LIMIT $3
"""
