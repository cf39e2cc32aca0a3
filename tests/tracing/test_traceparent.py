"""The api's check of the producer's `traceparent` header (W3C Trace Context)."""

from __future__ import annotations

import pytest

from evora.tracing.traceparent import MAX_LENGTH, valid_traceparent

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{PARENT}-01"


@pytest.mark.parametrize("value", [VALID, f"00-{TRACE}-{PARENT}-00", f"00-{TRACE}-{PARENT}-03"])
def test_version_00_is_kept_as_sent(value: str) -> None:
    assert valid_traceparent(value) == value


def test_a_later_version_is_read_by_its_first_fields_as_version_00() -> None:
    assert valid_traceparent(f"cc-{TRACE}-{PARENT}-01-what-comes-later") == VALID
    assert valid_traceparent(f"cc-{TRACE}-{PARENT}-01") == VALID


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        VALID.upper(),  # hex is lowercase
        f"00-{TRACE}-{PARENT}-01-",  # version 00 has exactly four fields
        f"00-{TRACE}-{PARENT}-1",
        f"00-{'0' * 32}-{PARENT}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"ff-{TRACE}-{PARENT}-01",  # version ff is invalid
        f"cc-{TRACE}-{PARENT}-01x",  # a later version's extra fields follow a dash
        f"0-{TRACE}-{PARENT}-01",
        f"00_{TRACE}_{PARENT}_01",
        f"cc-{TRACE}-{PARENT}-01-" + "x" * MAX_LENGTH,  # unbounded
        "00-" + "g" * 32 + f"-{PARENT}-01",
    ],
)
def test_malformed_is_none(value: str | None) -> None:
    assert valid_traceparent(value) is None
