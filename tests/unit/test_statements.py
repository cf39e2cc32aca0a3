"""The named SQL files: how they are read, and rules every statement in them keeps."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from evora.storage.notify import JOBS_CHANNEL
from evora.storage.statements import load, parse


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


def sql_files() -> list[str]:
    folder = resources.files("evora.storage").joinpath("sql")
    return [entry.read_text("utf-8") for entry in folder.iterdir() if entry.name.endswith(".sql")]


def test_every_hint_goes_to_the_channel_dispatchers_listen_on() -> None:
    channels = {c for text in sql_files() for c in re.findall(r"pg_notify\('([^']*)'", text)}
    assert channels == {JOBS_CHANNEL}
