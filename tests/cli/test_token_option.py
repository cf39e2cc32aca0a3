"""A token is opaque: one beginning with "-" is still the value of `--token`, for the worker
and for the operator commands alike (argparse alone reads it as the next option)."""

from __future__ import annotations

import pytest

from evora_services.cli import _parse


@pytest.mark.parametrize("token", ["-abc", "--abc", "-", "plain"])
def test_a_token_is_the_value_of_its_option_whatever_it_begins_with(token: str) -> None:
    assert _parse(["worker", "myapp.jobs", "--token", token, "--queues", "q"]).token == token
    assert _parse(["jobs", "list", "--token", token]).token == token


def test_the_equals_form_and_a_missing_value_behave_as_before() -> None:
    assert _parse(["worker", "myapp.jobs", "--token=-x"]).token == "-x"
    with pytest.raises(SystemExit):
        _parse(["worker", "myapp.jobs", "--token"])
