"""docs/architecture.md's state table is the code's: every row a move of TRANSITIONS
(evora/domain/states.py), every move a row."""

from __future__ import annotations

import re
from pathlib import Path

from evora.domain.states import TRANSITIONS, Transition
from evora.protocol.states import EventName, JobState

PAGE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"

# | from | to | event | when |, the from state `(new)` for a submission
ROW = re.compile(r"^\| (\(new\)|[A-Z]+) \| ([A-Z]+) \| `(\w+)` \| .+\|$", re.MULTILINE)


def _state_table() -> list[Transition]:
    section = PAGE.read_text("utf-8").split("## The state machine\n", 1)[1].split("\n## ", 1)[0]
    return [
        Transition(
            None if source == "(new)" else JobState(source), JobState(target), EventName(event)
        )
        for source, target, event in ROW.findall(section)
    ]


def test_the_state_table_is_the_code_s_transition_table() -> None:
    rows = _state_table()
    assert sorted(rows, key=str) == sorted(TRANSITIONS, key=str)
    assert len(rows) == len(set(rows))


def test_the_page_names_every_state() -> None:
    section = PAGE.read_text("utf-8").split("## The state machine\n", 1)[1]
    listed = section.split("\n\n", 1)[0]
    assert set(re.findall(r"`([A-Z]+)`", listed)) >= {state.value for state in JobState}
