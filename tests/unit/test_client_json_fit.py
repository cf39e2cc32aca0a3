"""`all_fit`: the one-pass check of a batch's payloads against the size limit."""

from __future__ import annotations

from evora.protocol.fields import all_fit


def test_values_over_the_limit_together_but_each_within_it_fit() -> None:
    # A thousand payloads of 2 kB are 2 MB together, over a 1 MB limit, and each is far
    # within it: the batch must not be sent back to be validated item by item for that.
    assert all_fit([{"data": "x" * 2_000}] * 1_000, 1_048_576)


def test_one_value_over_the_limit_does_not_fit() -> None:
    assert not all_fit(["x" * 50, "x" * 150, "x" * 50], 100)


def test_a_nul_does_not_fit() -> None:
    assert not all_fit(["fine", "a\u0000b"], 1_000)
    # the text "\u0000" (an escaped backslash) is not a NUL
    assert all_fit(["a\\u0000b"], 1_000)


def test_values_json_cannot_hold_do_not_fit() -> None:
    assert not all_fit([2**70], 1_000)
