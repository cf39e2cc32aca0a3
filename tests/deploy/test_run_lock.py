"""scripts/locks/local.txt and dev.txt, the versions `bash scripts/run.sh` and
`bash scripts/test.sh` install without asking any index: each must pin every package its
extra needs, at a version pyproject.toml allows, or the script falls back to a slow unpinned
install (and, for dev, to whatever linter and test tools were released last)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "scripts/locks"
_SELF = re.compile(r"^evora-queue\[(?P<extras>[^\]]+)\]$")


def _pins(extra: str) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (LOCKS / f"{extra}.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _requirements(extra: str) -> list[Requirement]:
    """What `pip install '.[extra]'` asks for of other projects (the project's own extras
    followed), for this platform."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    found: list[Requirement] = []
    todo, seen = [extra], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for spec in project["optional-dependencies"][name]:
            match = _SELF.match(spec)
            if match:
                todo.extend(e.strip() for e in match["extras"].split(","))
            else:
                wanted.append(spec)
    for spec in wanted:
        requirement = Requirement(spec)
        if requirement.marker is None or requirement.marker.evaluate():
            found.append(requirement)
    return found


@pytest.mark.parametrize("extra", ["local", "dev"])
def test_the_lock_pins_what_its_extra_needs_at_allowed_versions(extra: str) -> None:
    pins = _pins(extra)
    problems = []
    for requirement in _requirements(extra):
        version = pins.get(canonicalize_name(requirement.name))
        if version is None:
            problems.append(f"{requirement.name}: not pinned")
        elif not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{requirement.name}=={version} is not {requirement.specifier}")
    assert problems == []
