"""The named SQL files: how they are read, and rules every statement in them keeps."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from evora.storage import queries
from evora.storage.migrate import function_files
from evora.storage.notify import JOBS_CHANNEL
from evora.storage.statements import load, parse, with_rules


def test_statements_are_split_by_name_with_their_comments() -> None:
    text = "-- the file\n\n-- name: one\n-- about one\nSELECT 1;\n\n-- name: two\nSELECT\n  2;\n"
    assert parse(text) == {"one": "-- about one\nSELECT 1", "two": "SELECT\n  2"}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("-- name: one\nSELECT 1\n", "does not end with ';'"),
        ("-- name: one\nSELECT 1;\n-- name: one\nSELECT 2;\n", "named twice"),
    ],
)
def test_malformed_files_are_refused(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse(text)


def test_a_module_must_name_every_statement_of_its_file() -> None:
    with pytest.raises(ValueError, match="its module asks for"):
        load("outbox", "read_outbox")


def test_a_rule_is_put_in_where_it_is_named() -> None:
    """rules.sql states a rule once; every statement and function file that names it gets
    its text, and no text reaches PostgreSQL with a marker left in it."""
    rules = parse(resources.files("evora.storage").joinpath("rules.sql").read_text("utf-8"))
    turn = rules["group_turn"]
    assert "r.state IN ('RUNNING', 'SUSPENDED')" in turn
    assert turn in queries.CLAIM and turn in queries.UNCLAIMED_JOBS
    [claims] = [f for f in function_files() if f.name == "claims_and_transitions"]
    assert turn in claims.sql
    for text in [queries.CLAIM, queries.UNCLAIMED_JOBS, *(f.sql for f in function_files())]:
        assert "{{rule:" not in text


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("SELECT 1 WHERE {{rule:no_such_rule}}", "no rule 'no_such_rule'"),
        ("-- see {{rule:group_turn}}\nSELECT 1", "named in a comment"),
    ],
)
def test_a_rule_that_cannot_be_put_in_is_refused(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        with_rules(text)


def sql_files() -> list[str]:
    folder = resources.files("evora.storage").joinpath("sql")
    return [entry.read_text("utf-8") for entry in folder.iterdir() if entry.name.endswith(".sql")]


def test_every_hint_goes_to_the_channel_dispatchers_listen_on() -> None:
    channels = {c for text in sql_files() for c in re.findall(r"pg_notify\('([^']*)'", text)}
    assert channels == {JOBS_CHANNEL}
