"""Every relative link of the docs a newcomer reads leads somewhere: the file exists, and a
`#fragment` into a Markdown file names one of its headings (as GitHub makes their anchors)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = (
    REPO / "README.md",
    REPO / "CONTRIBUTING.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "docs" / "benchmarks").glob("*.md")),
    REPO / "sdks" / "typescript" / "README.md",
    REPO / "services" / "evora_services" / "pipeline" / "README.md",
)
LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s]+)\)")
FENCED = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1\s*$", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6} +(?P<title>.+?) *#*$", re.MULTILINE)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors: lower case, punctuation but `-` and `_` dropped, spaces to `-`, a
    repeated one numbered."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCED.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", match["title"].lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_relative_links_resolve() -> None:
    broken = []
    for page in PAGES:
        for match in LINK.finditer(FENCED.sub("", page.read_text())):
            target = match["target"]
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            path, _, fragment = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}: {target}"
            if not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
                broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)
