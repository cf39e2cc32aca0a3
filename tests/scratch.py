"""Where the session's own servers keep their data."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# What the session's two servers may come to hold (a template, the tests' databases, WAL
# between checkpoints): a few hundred MB seen; memory is taken only with room to spare.
_ROOM_BYTES = 4 << 30
_MEMORY = Path("/dev/shm")


def scratch_dir() -> str | None:
    """A directory in memory (tmpfs) for the test servers' data, or None for the default
    temporary directory. The tests' PostgreSQL runs without fsync, yet every database a test
    makes is a copy of the template's files and every drop an unlink, which on a VM's disk
    waited for the disk: CREATE DATABASE took 300-600 ms on this project's ext4 box, 20-35 ms
    in memory. Nothing a test checks depends on the disk: the crash tests' durable servers
    live here too (tests/e2e/clusters.py says why a kill -9 loses no more on a disk)."""
    if not _MEMORY.is_dir() or not os.access(_MEMORY, os.W_OK):
        return None
    if shutil.disk_usage(_MEMORY).free < _ROOM_BYTES:
        return None
    return str(_MEMORY)
