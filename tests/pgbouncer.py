"""Debian's stock PgBouncer (scripts/test.sh installs the `pgbouncer` package) in front of the
test PostgreSQL, on a free loopback port, in session or transaction mode: the pooler users
put in front of Evora. Missing, it fails the test rather than skip it."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from evora.embedded._runas import server_account

PGBOUNCER = "/usr/sbin/pgbouncer"
START_TIMEOUT_S = 10.0

PoolMode = Literal["session", "transaction"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def pgbouncer(server_dsn: str, mode: PoolMode, *, pool_size: int = 20) -> Iterator[int]:
    """A PgBouncer passing every database of the server at `server_dsn` (loopback TCP, trust)
    through in `mode`, with `pool_size` server connections per database; yields its port.
    Stock settings otherwise: in particular no ignore_startup_parameters, and no
    prepared-statement support (1.18 has none)."""
    binary = shutil.which("pgbouncer") or PGBOUNCER
    assert os.access(binary, os.X_OK), "pgbouncer is missing: scripts/test.sh installs it"
    server = urlsplit(server_dsn)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="evora-pgbouncer-") as tmp:
        ini = Path(tmp) / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={server.hostname} port={server.port} user={server.username}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
            f"auth_type = any\npool_mode = {mode}\n"
            f"max_client_conn = 500\ndefault_pool_size = {pool_size}\n"
            "logfile =\npidfile =\nsyslog = 0\n"
        )
        os.chmod(tmp, 0o755)
        os.chmod(ini, 0o644)
        account = server_account()  # PgBouncer refuses to run as root
        command = [binary, *(["-u", account.name] if account else []), str(ini)]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _listening(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    output = process.communicate()[0].decode(errors="replace")
                    raise AssertionError(f"pgbouncer did not start:\n{output}")
                time.sleep(0.02)
            yield port
        finally:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()


def through(dsn: str, port: int) -> str:
    """`dsn` with PgBouncer's address instead of the server's."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}"))
