"""The dashboard's copy of the state names is the protocol's, in its order."""

from __future__ import annotations

import json
import re
from pathlib import Path

from evora.protocol.states import JobState

FORMAT_JS = Path(__file__).resolve().parents[2] / "evora_services/api/dashboard/static/format.js"


def test_dashboard_states_are_the_protocol_states() -> None:
    source = FORMAT_JS.read_text(encoding="utf-8")
    match = re.search(r"export const STATES = (\[[^\]]*\]);", source)
    assert match is not None
    assert json.loads(match[1]) == [state.value for state in JobState]
    titles = re.search(r"export const STATE_TITLES = \{([^}]*)\}", source)
    assert titles is not None
    assert re.findall(r"(\w+):", titles[1]) == [state.value for state in JobState]
