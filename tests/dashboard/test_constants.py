"""The dashboard's copy of the state names is the protocol's, in its order."""

from __future__ import annotations

import json
import re
from pathlib import Path

from evora.protocol.states import JobState

REPO = Path(__file__).resolve().parents[2]
FORMAT_JS = REPO / "services/evora_services/api/dashboard/static/format.js"


def test_dashboard_states_are_the_protocol_states() -> None:
    source = FORMAT_JS.read_text(encoding="utf-8")
    match = re.search(r"export const STATES = (\[[^\]]*\]);", source)
    assert match is not None
    assert json.loads(match[1]) == [state.value for state in JobState]
    titles = re.search(r"export const STATE_TITLES = \{([^}]*)\}", source)
    assert titles is not None
    assert re.findall(r"(\w+):", titles[1]) == [state.value for state in JobState]


STYLE_CSS = FORMAT_JS.with_name("style.css")


def scheme_colours(block: str) -> dict[str, tuple[str, str]]:
    """State -> (text colour, background) as a `:root` block of style.css defines them."""
    found = dict(re.findall(r"--state-(\w+(?:-bg)?):\s*(#[0-9a-f]{6});", block))
    return {s.value: (found.get(s.value, ""), found.get(f"{s.value}-bg", "")) for s in JobState}


def test_every_state_has_its_own_colours_in_both_schemes_and_a_class() -> None:
    css = STYLE_CSS.read_text(encoding="utf-8")
    light, _, dark = css.partition("@media (prefers-color-scheme: dark)")
    for block in (light, dark):
        root = block[block.index(":root {") : block.index("}", block.index(":root {"))]
        colours = scheme_colours(root)
        assert all(text and back for text, back in colours.values()), colours
        # no two states look alike
        assert len({text for text, _ in colours.values()}) == len(colours), colours
        assert len({back for _, back in colours.values()}) == len(colours), colours
    for state in JobState:
        rule = rf"\.state-{state.value} \{{ --state-fg: var\(--state-{state.value}\); "
        assert re.search(rule, css), state
