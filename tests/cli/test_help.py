"""`evora --version` and a real `--help` for every command."""

from __future__ import annotations

import argparse
from importlib import metadata

import pytest

from evora_services.cli import _parser
from tests.cli.commands import evora


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = _parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_version() -> None:
    result = evora("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"evora {metadata.version('evora')}"


@pytest.mark.parametrize("name", sorted(_commands()))
def test_every_command_has_a_description_and_what_it_reads(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args([name, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    parser = _commands()[name]
    # More than the usage line and the options: a sentence about what it does.
    assert parser.description and len(parser.description) > 40, name
    assert parser.description.split(".")[0] in " ".join(text.split())
    assert "environment:" in text or name == "pipeline", name
