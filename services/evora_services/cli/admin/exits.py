"""Exit statuses of the operator commands, so that a script can tell what happened."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    # The api refused the request for a reason not listed below (a 400 or 422, say).
    REFUSED = 1
    # The command line is wrong (argparse's own status) or no token is configured.
    USAGE = 2
    NOT_FOUND = 3
    # The job is not in a state that allows it (retrying a job that is not in the DLQ).
    CONFLICT = 4
    # The token is missing, unknown, or its role may not do this.
    UNAUTHORIZED = 5
    # The api cannot be reached, or is unavailable (503).
    UNREACHABLE = 6
    # `evora jobs get --wait`: the job finished, but not COMPLETED (DLQ or CANCELLED).
    JOB_FAILED = 7
    # `evora jobs get --wait`: the job had not finished when the wait ran out.
    TIMED_OUT = 8
