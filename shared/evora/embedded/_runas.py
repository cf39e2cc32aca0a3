"""Running PostgreSQL when we are root.

initdb and postgres refuse to run as root, and CI containers commonly run everything as
root, so in that case the server runs as an unprivileged system account created on demand.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import pwd
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from evora.embedded._process import EmbeddedServerError

log = logging.getLogger(__name__)

SERVER_USER = "evora-pg"
# where useradd writes the accounts; creations lock it (`_create_system_user`)
ACCOUNTS_DIR = "/etc"


@dataclass(frozen=True)
class RunAs:
    name: str
    uid: int
    gid: int


def server_account(name: str = SERVER_USER) -> RunAs | None:
    """The account to run PostgreSQL as, or None to run it as ourselves."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        entry = _create_system_user(name)
    return RunAs(name, entry.pw_uid, entry.pw_gid)


def _create_system_user(name: str) -> pwd.struct_passwd:
    """Creates the account once, however many processes start a server at the same moment.

    useradd's own lock on /etc/passwd does not hold in every container: four useradd of one
    name at once all exit 0 there, each writing the account with the uid it chose, and the
    server a process started under the uid it read first then fails ("could not look up
    effective user ID"). So creations are serialized here, and the name looked up again
    under the lock.
    """
    useradd = shutil.which("useradd") or shutil.which("useradd", path="/usr/sbin:/sbin")
    if useradd is None:
        raise EmbeddedServerError(
            f"running as root, PostgreSQL needs an unprivileged account {name!r} and useradd "
            "is not available: create that user, or run as a non-root user"
        )
    # The lock is taken on /etc itself: one inode every process reaches whatever its TMPDIR,
    # writable by root only, and nothing to create (useradd replaces /etc/passwd by renaming,
    # so a lock on that file would not outlive the first creation).
    lock = os.open(ACCOUNTS_DIR, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
        options = ["--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"]
        result = subprocess.run(
            [useradd, *options, "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            return pwd.getpwnam(name)
        except KeyError:
            raise EmbeddedServerError(
                f"could not create system user {name!r}: {result.stderr.strip()}"
            ) from None
    finally:
        os.close(lock)


def make_reachable(path: Path, account: RunAs) -> None:
    """Let ``account`` traverse every ancestor of ``path``.

    Only the search (x) bit is added for others, never read: the account can reach the
    directories it owns below without being able to list anything on the way.
    """
    changed: list[str] = []
    for parent in path.parents:
        st = parent.stat()
        if _can_search(st, account):
            continue
        parent.chmod(stat.S_IMODE(st.st_mode) | stat.S_IXOTH)
        changed.append(str(parent))
    if changed:
        log.warning("added o+x to %s so %s can reach %s", ", ".join(changed), account.name, path)


@functools.cache
def make_tree_readable(root: Path) -> None:
    """Let everyone read ``root`` and run its executables, as the wheel's own launcher does.

    Needed when a restrictive umask was in force at pip install time; cached because the
    tree (about 2000 files) never changes within a process.
    """
    for dirpath, _dirnames, filenames in os.walk(root):
        _add_bits(Path(dirpath), stat.S_IROTH | stat.S_IXOTH)
        for name in filenames:
            file = Path(dirpath) / name
            mode = file.lstat().st_mode
            if stat.S_ISLNK(mode):
                continue
            executable = stat.S_IXOTH if mode & stat.S_IXUSR else 0
            _add_bits(file, stat.S_IROTH | executable)


def _add_bits(path: Path, bits: int) -> None:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & bits != bits:
        path.chmod(mode | bits)


def _can_search(st: os.stat_result, account: RunAs) -> bool:
    if st.st_uid == account.uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == account.gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)
