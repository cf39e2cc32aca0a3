"""`import evora` and the `evora` command import the SDK (aiohttp, ssl) only when it is used:
each `evora` start and each service otherwise paid about half a second of CPU for it. The
package still exports the SDK's names as before."""

from __future__ import annotations

import os
import subprocess
import sys

import evora
import evora.sdk

# What only a command that talks HTTP, or runs an event loop, needs.
HEAVY = ("evora.sdk", "aiohttp", "ssl", "asyncio", "importlib.metadata")


def _imported_by(code: str) -> list[str]:
    """Which of HEAVY a fresh interpreter holds after running `code`."""
    check = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_package_exports_the_sdk() -> None:
    assert evora.__all__ == evora.sdk.__all__
    for name in evora.__all__:
        assert getattr(evora, name) is getattr(evora.sdk, name), name
    assert set(evora.__all__) <= set(dir(evora))


def test_star_import_and_submodules_still_work() -> None:
    code = (
        "from evora import *\n"
        "from evora import loops\n"
        "assert Client.__module__ == 'evora.sdk.client' and loops.__name__ == 'evora.loops'\n"
        "import evora\n"
        "try:\n"
        "    evora.NoSuchName\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('evora.NoSuchName resolved')\n"
    )
    assert "aiohttp" in _imported_by(code)


def test_import_evora_imports_no_sdk() -> None:
    assert _imported_by("import evora, evora.protocol.states, evora.logs") == []


def test_the_command_line_parser_imports_no_sdk() -> None:
    """What `evora --help`, `evora migrate` and every service pay before their own imports."""
    assert _imported_by("from evora_services.cli import _parser\n_parser()") == []
