"""docs/configuration.md lists exactly the EVORA_* variables the code reads, with the
defaults the code uses."""

from __future__ import annotations

import re
from pathlib import Path

from evora.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
NAME = re.compile(r"EVORA_[A-Z0-9_]+")


def documented() -> dict[str, str]:
    """Variable -> the rest of its table row."""
    rows: dict[str, str] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        match = re.match(r"\| `(EVORA_[A-Z0-9_]+)` \|(.*)", line)
        if match:
            rows[match[1]] = match[2]
    return rows


def read_by_code() -> set[str]:
    names = {f"EVORA_{field.upper()}" for field in Settings.model_fields}
    for package in ("shared/evora", "services/evora_services"):
        for path in (ROOT / package).rglob("*.py"):
            names.update(NAME.findall(path.read_text(encoding="utf-8")))
    return names


def test_every_variable_the_code_reads_is_documented_and_no_other() -> None:
    assert set(documented()) == read_by_code()


def test_documented_numeric_defaults_are_the_code_defaults() -> None:
    rows = documented()
    checked = 0
    for field, info in Settings.model_fields.items():
        if isinstance(info.default, int) and not isinstance(info.default, bool):
            default_column = rows[f"EVORA_{field.upper()}"].rsplit("|", 2)[-2]
            assert f"`{info.default}`" in default_column, field
            checked += 1
    assert checked >= 10
