"""The checks of a raw body before it is parsed cost linear time, whatever it holds."""

from __future__ import annotations

import time

import pytest

from evora.http.bodies import check_raw_json
from evora.http.problems import Problem

# The body below is 14 MiB of 299-digit runs inside strings (valid, and within the limits).
# The earlier search for numbers beyond a double was quadratic in a run's length and took
# 4-7 s on it, all on the event loop; now it takes about 0.2 s.
WITHIN_S = 2.0


def test_long_runs_of_digits_cost_linear_time() -> None:
    raw = b'{"jobs": [' + b",".join([b'"' + b",".join([b"1" * 299] * 3300) + b'"'] * 15) + b"]}"
    started = time.perf_counter()
    check_raw_json(raw, max_values=10**6)
    seconds = time.perf_counter() - started
    print(f"{len(raw) / 2**20:.1f} MiB of digit runs checked in {seconds * 1000:.0f} ms")
    assert seconds < WITHIN_S


@pytest.mark.parametrize("number", [b"1e400", b"-1.5E+0309", b"9" * 310 + b".5"])
def test_numbers_beyond_a_double_are_refused(number: bytes) -> None:
    with pytest.raises(Problem) as refused:
        check_raw_json(b'{"payload": [1, ' + number + b"]}")
    assert refused.value.status == 422


@pytest.mark.parametrize("number", [b"1e308", b"0.00001e309", b"1e-400", b"9" * 299])
def test_numbers_a_double_holds_pass(number: bytes) -> None:
    check_raw_json(b'{"payload": [1, ' + number + b', "1e999"]}')
