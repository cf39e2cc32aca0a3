"""docs/sdk-python.md is what scripts/sdk_reference.py writes from the SDK's signatures and
docstrings: a method added, renamed or re-documented fails here until it is regenerated."""

from __future__ import annotations

from scripts.sdk_reference import TARGET, render


def test_the_python_sdk_reference_is_current() -> None:
    assert TARGET.read_text() == render(), (
        "docs/sdk-python.md is stale: .venv/bin/python -m scripts.sdk_reference"
    )
