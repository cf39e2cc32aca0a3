"""The repository stands alone: no tracked file points at documents kept outside it, and
every pointer into docs/ (a page, or a heading of one) leads somewhere.

The patterns below are written so that this file does not match them itself.
"""

from __future__ import annotations

import posixpath
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

OUTSIDE = re.compile(
    r"CONTRACT\.md|DESIGN\.md|CONTRACT\s+sections?\b|DESIGN\s+rules?\b|\.\./shared\b|/work[/]shared",
    re.IGNORECASE,
)
# Applied migrations are checksummed (shared/evora/storage/migrate.py): editing one, even a
# comment, would make every database that applied it refuse to start. This comment predates
# the rule; docs/architecture.md says what it refers to.
FROZEN = {("shared/evora/storage/migrations/0004_event_archive.sql", " ".join(("DESIGN", "rule")))}

# `docs/<page>.md` or `docs/<page>.md#<heading>`, anywhere in a tracked file.
DOC_POINTER = re.compile(r"\bdocs/([\w-]+\.md)(?:#([\w-]+))?")
# Links between the pages of docs/: `](page.md#heading)` and `](#heading)`.
DOC_LINK = re.compile(r"\]\(([\w-]+\.md)?(?:#([\w-]+))?\)")
# Repository paths the hand-written architecture and API pages name in backquotes.
PATH_IN_BACKQUOTES = re.compile(r"`((?:shared|services|tests|docs|scripts|deploy|k8s)/[\w./-]+)`")
CHECKED_PAGES = ("architecture.md", "http-api.md")


@cache
def tracked_texts() -> dict[str, str]:
    """Every tracked regular file that is text, by path."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git work tree")
    texts = {}
    for name in listed.decode().split("\0"):
        path = ROOT / name
        if not name or path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" not in data:
            texts[name] = data.decode("utf-8", "replace")
    return texts


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@cache
def anchors(page: str) -> set[str]:
    path = ROOT / "docs" / page
    found: set[str] = set()
    for line in path.read_text("utf-8").splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            base = slug(match[1])
            anchor, n = base, 0
            while anchor in found:  # GitHub numbers repeated headings
                n += 1
                anchor = f"{base}-{n}"
            found.add(anchor)
    return found


def test_the_tree_is_seen() -> None:
    texts = tracked_texts()
    assert "README.md" in texts
    assert "tests/unit/test_repository_stands_alone.py" in texts


def test_no_tracked_file_points_outside_the_repository() -> None:
    offending = [
        f"{name}:{text.count(chr(10), 0, match.start()) + 1}: {match[0]}"
        for name, text in tracked_texts().items()
        for match in OUTSIDE.finditer(text)
        if (name, re.sub(r"\s+", " ", match[0])) not in FROZEN
    ]
    assert offending == []


def test_the_frozen_exception_is_still_needed() -> None:
    texts = tracked_texts()
    for name, words in FROZEN:
        assert words in texts.get(name, ""), f"{name} no longer needs its exception"


def _broken(page: str, anchor: str | None) -> str | None:
    if not (ROOT / "docs" / page).is_file():
        return f"docs/{page} does not exist"
    if anchor is not None and anchor not in anchors(page):
        return f"docs/{page} has no heading #{anchor}"
    return None


def test_pointers_into_docs_lead_somewhere() -> None:
    broken = []
    for name, text in tracked_texts().items():
        for match in DOC_POINTER.finditer(text):
            if problem := _broken(match[1], match[2]):
                broken.append(f"{name}: {problem}")
        if name.startswith("docs/") and name.endswith(".md"):
            own = name.removeprefix("docs/")
            for match in DOC_LINK.finditer(text):
                if match[1] is None and match[2] is None:
                    continue
                # a page's link is relative to its own folder (docs/benchmarks/ too)
                target = posixpath.join(posixpath.dirname(own), match[1]) if match[1] else own
                if problem := _broken(target, match[2]):
                    broken.append(f"{name}: {problem}")
    assert broken == []


@pytest.mark.parametrize("page", CHECKED_PAGES)
def test_paths_the_pages_name_exist(page: str) -> None:
    text = (ROOT / "docs" / page).read_text("utf-8")
    named = set(PATH_IN_BACKQUOTES.findall(text))
    assert named, "no paths found: has the pattern gone stale?"
    assert sorted(p for p in named if not (ROOT / p).exists()) == []
