"""`evora --version` and a real `--help` for every command."""

from __future__ import annotations

import argparse
from importlib import metadata

import pytest

from evora_services.cli import DISTRIBUTION, _parser
from tests.cli.commands import evora


def _commands(
    parser: argparse.ArgumentParser | None = None, path: tuple[str, ...] = ()
) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every command and subcommand, by the words that name it."""
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    for action in (parser or _parser())._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found[(*path, name)] = child
                found.update(_commands(child, (*path, name)))
    return found


def test_version() -> None:
    result = evora("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"evora {metadata.version(DISTRIBUTION)}"


@pytest.mark.parametrize("path", sorted(_commands()), ids=" ".join)
def test_every_command_has_a_description_and_what_it_reads(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args([*path, "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    parser = _commands()[path]
    # More than the usage line and the options: a sentence about what it does.
    assert parser.description and len(parser.description) > 10, path
    assert parser.description.split(".")[0] in text
    assert "environment:" in text, path
