"""`evora worker` finds the dispatcher without --url: EVORA_DISPATCHER_URL, else the
dispatcher of this machine on EVORA_DISPATCHER_PORT."""

from __future__ import annotations

import argparse

import pytest

from evora_services.cli import _dispatcher_url
from tests.cli.commands import evora, one_line


def _args(url: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(url=url)


def test_the_port_names_the_dispatcher_of_this_machine() -> None:
    assert _dispatcher_url(_args(), {"EVORA_DISPATCHER_PORT": "9191"}) == "http://127.0.0.1:9191"


def test_a_url_wins_over_the_port_and_the_option_over_both() -> None:
    env = {"EVORA_DISPATCHER_PORT": "9191", "EVORA_DISPATCHER_URL": "http://d.example:81"}
    assert _dispatcher_url(_args(), env) == "http://d.example:81"
    assert _dispatcher_url(_args("http://x:1"), env) == "http://x:1"


def test_without_either_the_module_s_own_or_the_default_applies() -> None:
    assert _dispatcher_url(_args(), {}) is None


@pytest.mark.parametrize("port", ["http", "0", "70000"])
def test_a_bad_port_is_one_line(port: str) -> None:
    result = evora(
        "worker", "examples.worker_example", "--queues", "demo", env={"EVORA_DISPATCHER_PORT": port}
    )
    assert result.returncode == 2
    assert one_line(result.stderr) == (
        "evora: invalid configuration: EVORA_DISPATCHER_PORT must be a port number (1-65535)"
    )
