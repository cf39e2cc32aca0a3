"""The bounds of the HTTP interface: what names look like and how much one request may
carry. The services validate against these, the SDK checks what it can before sending, and
docs/http-api.md and docs/bounds.md describe them. ("Limits" are flow control's, per key:
docs/flow-control.md.)"""

from __future__ import annotations

from typing import Final

# Queue names, and limit keys, use this alphabet; job types a slightly wider one.
QUEUE_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
TYPE_PATTERN: Final = r"^[A-Za-z0-9_.:-]{1,255}$"
# Limit keys (docs/flow-control.md): the queue alphabet, up to 255 characters; a job holds at
# most MAX_LIMIT_KEYS of them. A limit's key may end in `*`, making it a prefix limit.
LIMIT_KEY_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}$"
LIMIT_NAME_PATTERN: Final = r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]{0,254}|[A-Za-z0-9_.:-]{0,253}\*)$"
MAX_LIMIT_KEYS: Final = 8
# Idempotency keys, group keys and worker ids: 1..255 characters, no U+0000 (PostgreSQL
# text cannot hold it).
KEY_MAX_LENGTH: Final = 255

# The largest job payload, result or progress value (encoded JSON) unless
# EVORA_MAX_PAYLOAD_BYTES says otherwise.
DEFAULT_MAX_PAYLOAD_BYTES: Final = 1_048_576
# Intervals beyond ten years overflow nothing in PostgreSQL, but no sane schedule needs them;
# bounding them keeps every computed timestamp representable.
MAX_SECONDS: Final = 10 * 365 * 24 * 3600
# A job's retry backoff when its submission gives none (docs/http-api.md): the model's
# defaults and the row reader that fills a default stored as NULL (migration 0067) read these;
# evora.limits() in SQL holds the same numbers (tests/sql_enqueue/test_bounds.py).
DEFAULT_BACKOFF_INITIAL_SECONDS: Final = 1.0
DEFAULT_BACKOFF_MAX_SECONDS: Final = 3600.0
DEFAULT_BACKOFF_MULTIPLIER: Final = 2.0
# The longest one snooze may wait (docs/jobs-that-wait.md): a worker polling something
# external asks again within a month; a longer wait is a schedule's (docs/schedules.md).
MAX_SNOOZE_SECONDS: Final = 30 * 24 * 3600
# The longest an upstream's retry-after may drain a limit key's bucket (docs/flow-control.md,
# "Upstream retry-after"): a day. A rate-limit answer asks for seconds to hours; a key drained
# longer by a wrong header would hold back every job of every worker holding it.
MAX_RETRY_AFTER_SECONDS: Final = 24 * 3600
# Checkpoints of one job (docs/jobs-that-wait.md): at most this many names, and all of them
# together (their JSON text, as stored) at most a payload's default size: a job carries its
# steps' results to its next attempt, not a store of its own.
MAX_CHECKPOINTS: Final = 100
MAX_CHECKPOINT_BYTES: Final = 1_048_576
CHECKPOINT_NAME_PATTERN: Final = r"^[A-Za-z0-9_.:-]{1,255}$"
# The longest a job may wait suspended on a callback (docs/callbacks.md): a person's approval
# or a slow partner's webhook within a month; longer waits are a schedule's.
MAX_CALLBACK_TIMEOUT_SECONDS: Final = 30 * 24 * 3600

KIB: Final = 1024
MIB: Final = 1024 * KIB

# Bodies of many items (a batch, acks) are held in memory while they are validated, so
# their bound is about memory, not 1000 x the largest payload: big items come in smaller
# bodies. At the largest EVORA_MAX_PAYLOAD_BYTES (64 MiB) this is 256 MiB. No body of any
# endpoint is larger.
ITEMS_BODY_FLOOR: Final = 16 * MIB
ITEMS_PAYLOADS: Final = 4


def items_body_bytes(max_payload_bytes: int) -> int:
    """The largest body of many items, and of any request."""
    return max(ITEMS_BODY_FLOOR, ITEMS_PAYLOADS * max_payload_bytes)


# The memory request bodies may take in one service process (evora.http.budget) unless
# EVORA_BODY_BUDGET_BYTES says otherwise, raised to twice the largest body if that is more.
DEFAULT_BODY_BUDGET_BYTES: Final = 64 * MIB

# The jobs one job may wait for (docs/dependencies.md).
MAX_DEPENDENCIES: Final = 1000
# A dependency on an earlier item of the same batch: "ref:" and the name that item carries.
DEPENDENCY_REF_PREFIX: Final = "ref:"
REF_PATTERN: Final = r"^[A-Za-z0-9_.:-]{1,255}$"

# Jobs in one POST /v1/jobs/batch; outcomes in one POST /v1/acks.
MAX_BATCH: Final = 1000
# Children one running job submits and waits for in one request (docs/jobs-that-wait.md).
MAX_CHILDREN: Final = 10_000
MAX_ACKS: Final = 1000
# One claim: queues named, jobs handed out, seconds it may wait.
MAX_CLAIM_QUEUES: Final = 20
MAX_CLAIM_JOBS: Final = 500
MAX_WAIT_SECONDS: Final = 60
# Long stack traces are useful up to a point; beyond it they only bloat every event row.
MAX_ERROR_MESSAGE: Final = 8192
# The stack trace a worker reports with a failure: its last characters (the innermost
# frames and the exception) are kept when it is longer.
MAX_ERROR_TRACEBACK: Final = 8192
# Items in one page of a list endpoint.
MAX_PAGE: Final = 500
