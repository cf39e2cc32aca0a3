"""The checks of a raw body before it is parsed cost linear time, whatever it holds."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from evora.http import bodies
from evora.http.bodies import check_raw_json
from evora.http.problems import Problem
from evora.protocol import fields

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


class _Counted:
    """A compiled pattern that counts the calls made to it."""

    def __init__(self, pattern: re.Pattern[bytes]) -> None:
        self.pattern = pattern
        self.calls = 0

    def sub(self, *args: Any) -> bytes:
        self.calls += 1
        return self.pattern.sub(*args)

    def finditer(self, *args: Any) -> Iterator[re.Match[bytes]]:
        self.calls += 1
        return self.pattern.finditer(*args)

    def search(self, *args: Any) -> re.Match[bytes] | None:
        self.calls += 1
        return self.pattern.search(*args)


def test_an_ack_body_full_of_ids_takes_no_pattern(monkeypatch: pytest.MonkeyPatch) -> None:
    # Hex ids such as `...e0123...` look like a three-digit exponent to the byte-level hint,
    # and a body of a hundred random ids nearly always holds one: every ack body went
    # through both patterns, 5-7 us of the dispatcher's time per ack before parsing (the
    # parse itself about 4); 1.0-1.2 us without them.
    homes = {"_STRING": fields, "_HUGE_NUMBER": bodies}
    counted = {name: _Counted(getattr(home, name)) for name, home in homes.items()}
    for name, pattern in counted.items():
        monkeypatch.setattr(homes[name], name, pattern)
    ids = [f"{i:08x}-4e01-7e00-8e99-{i:04x}e0123456" for i in range(1000)]
    acks = [
        {"id": i, "outcome": "complete", "lease_token": i, "result": {"n": 1.5e30}} for i in ids
    ]
    check_raw_json(orjson.dumps({"acks": acks}), max_values=10**6)
    assert {name: pattern.calls for name, pattern in counted.items()} == {
        "_STRING": 0,
        "_HUGE_NUMBER": 0,
    }


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": "1e999", "b": ["x", "NaN"], "c": 1e300}',
        b'{"a": "q\\"1e999", "b": 1e999}',  # an escaped quote: the pattern finds the strings
        b'{"a": "1e999, "b": 1e999}',  # unbalanced quotes: likewise
        b'{"a": "e000", "b": [1e400]}',
    ],
)
def test_the_skeleton_empties_exactly_the_strings(raw: bytes) -> None:
    assert bodies._Scan(raw).skeleton == fields._STRING.sub(b'""', raw)
