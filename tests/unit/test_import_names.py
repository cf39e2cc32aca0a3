"""Evora's import names never collide with an application's: the services are the package
`evora_services` (its source root is `services/`, which is never itself on the path), so a
user's own `services`, `api` or `shared` package, first on the path, stays the user's, and
ours stay ours."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import api, evora, evora.tracing, evora_services.api.app, evora_services.cli, services, shared
for module in (evora, evora.tracing, evora_services.api.app, evora_services.cli):
    print(module.__name__, module.__file__)
for module in (services, api, shared):
    print(module.__name__, module.WHOSE)
"""


def test_a_users_services_and_api_packages_do_not_collide_with_ours(tmp_path: Path) -> None:
    for name in ("services", "api", "shared"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("WHOSE = 'the user'\n")
    # `python -c` puts its working directory first on sys.path: the user's packages win
    # any lookup a name of theirs could lose.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"evora {REPO / 'shared/evora/__init__.py'}",
        f"evora.tracing {REPO / 'shared/evora/tracing/__init__.py'}",
        f"evora_services.api.app {REPO / 'services/evora_services/api/app.py'}",
        f"evora_services.cli {REPO / 'services/evora_services/cli/__init__.py'}",
        "services the user",
        "api the user",
        "shared the user",
    ]


def test_nothing_of_the_repository_but_its_two_packages_is_importable(tmp_path: Path) -> None:
    # Outside the checkout, the install puts the source roots on the path, not the
    # repository: `services`, `shared`, `tests`, `scripts` and `bench` are not ours to take.
    probe = (
        "import importlib.util\n"
        "for name in ('evora', 'evora_services', 'services', 'shared', 'tests', 'scripts',"
        " 'bench', 'api'):\n"
        "    print(name, importlib.util.find_spec(name) is not None)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=tmp_path,
        env=env,
    )
    assert done.stdout.splitlines() == [
        "evora True",
        "evora_services True",
        "services False",
        "shared False",
        "tests False",
        "scripts False",
        "bench False",
        "api False",
    ]
