"""Where the harnesses run by these tests keep their servers' data."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import pytest

from tests.scratch import scratch_dir


@pytest.fixture(scope="module", autouse=True)
def _temporary_files_in_memory() -> Iterator[None]:
    """The harnesses' temporary directories (their durable PostgreSQL, logs, runner outputs)
    in memory, for this process's harnesses (`tempfile`) and the child processes it starts
    (TMPDIR). Every commit and CHECKPOINT of a durable cluster waited for the VM's disk: the
    bench tests wrote 6.7 GB in a run. No test here asserts a figure, so nothing they check
    depends on the disk; users choose the directory the same way (TMPDIR, or `--keep`).
    Module-wide, so that a module's shared cluster is in memory too."""
    directory = scratch_dir()
    with pytest.MonkeyPatch.context() as patch:
        if directory is not None:
            patch.setenv("TMPDIR", directory)
            patch.setattr(tempfile, "tempdir", directory)
        yield
