"""What Evora's spans are called and carry, on both sides of the wire (docs/tracing.md): the
api's `submit`, the dispatcher's `claim`, the worker's `run` and `ack`. Attribute names follow
the OpenTelemetry messaging semantic conventions where one fits; Evora's own are `evora.*`."""

from __future__ import annotations

from typing import Final

# The W3C Trace Context header a producer sends with a submission, and the claimed job's
# optional field that hands it on to the worker.
TRACEPARENT: Final = "traceparent"

SYSTEM: Final = "evora"

# span names, which are also the messaging operation names
SUBMIT: Final = "submit"
CLAIM: Final = "claim"
RUN: Final = "run"
ACK: Final = "ack"

# messaging.operation.type of each
OPERATION_TYPES: Final = {SUBMIT: "send", CLAIM: "receive", RUN: "process", ACK: "settle"}

MESSAGING_SYSTEM: Final = "messaging.system"
OPERATION_NAME: Final = "messaging.operation.name"
OPERATION_TYPE: Final = "messaging.operation.type"
DESTINATION: Final = "messaging.destination.name"
MESSAGE_ID: Final = "messaging.message.id"
MESSAGE_COUNT: Final = "messaging.batch.message_count"
CLIENT_ID: Final = "messaging.client.id"
JOB_TYPE: Final = "evora.job.type"
JOB_ATTEMPT: Final = "evora.job.attempt"
# submit: created or replayed; run: complete, fail, release or abandon; ack: complete or fail
JOB_OUTCOME: Final = "evora.job.outcome"


def operation(name: str) -> dict[str, str]:
    """The attributes every span of operation `name` carries."""
    return {
        MESSAGING_SYSTEM: SYSTEM,
        OPERATION_NAME: name,
        OPERATION_TYPE: OPERATION_TYPES[name],
    }
