"""bench.audit's A/B (`--baseline REV`): another revision's auditor, imported from git under
a module name of its own with that revision's statements, audits the same history as this
checkout's. Performance is not asserted."""

from __future__ import annotations

from pathlib import Path

from bench.audit import baseline_audit, write_history
from evora.storage.audit import audit


async def test_a_revisions_auditor_from_git_audits_the_history_beside_this_checkouts(
    db_url: str, tmp_path: Path
) -> None:
    events = await write_history(db_url, 1_000)
    baseline = baseline_audit("HEAD", tmp_path)
    assert baseline is not audit

    old = await baseline(db_url, from_seq=1)
    new = await audit(db_url, from_seq=1)

    assert old.ok, old.text()
    assert (old.events, old.jobs, old.to_seq) == (new.events, new.jobs, new.to_seq)
    assert old.events == events
    assert [c.name for c in old.checks] == [c.name for c in new.checks]
