"""The NOTIFY debouncer's trailing hints, with a recording `send` in place of the database
(the statements themselves are tested in tests/integration/test_hints.py)."""

from __future__ import annotations

import logging

import pytest

from evora.storage.notify import NotifyDebouncer


async def test_a_hint_settled_by_a_later_statement_is_not_sent_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent: list[list[str]] = []

    async def send(queues: list[str]) -> None:
        sent.append(queues)

    debouncer = NotifyDebouncer(send, interval=0.05)
    debouncer.record(["q"])
    debouncer.owe(["q"])
    debouncer.record(["q"])  # a later statement notified q before the trailing hint went
    with caplog.at_level(logging.WARNING, logger="evora.storage.notify"):
        await debouncer.close()
    assert sent == []
    assert not caplog.records


async def test_owed_queues_go_together_when_their_windows_end() -> None:
    sent: list[list[str]] = []

    async def send(queues: list[str]) -> None:
        sent.append(queues)

    debouncer = NotifyDebouncer(send, interval=0.05)
    debouncer.record(["a", "b"])
    assert sorted(debouncer.suppressed()) == ["a", "b"]
    debouncer.owe(["b"])
    debouncer.owe(["a"])
    await debouncer.close()
    assert sent == [["a", "b"]]
    assert sorted(debouncer.suppressed()) == ["a", "b"]  # a new window for each
