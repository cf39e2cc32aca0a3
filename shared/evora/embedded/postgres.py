"""A real PostgreSQL server run as our child process, for ``evora dev`` and the tests."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from evora.embedded._pgbin import find_bin_dir, wheel_install_root
from evora.embedded._process import (
    EmbeddedServerError,
    ServerProcess,
    file_tail,
    free_loopback_port,
    lines_tail,
    stop_process,
)
from evora.embedded._runas import RunAs, make_reachable, make_tree_readable, server_account

# Unix socket paths are limited to ~107 bytes; the data directory is often deeper than that.
_MAX_SOCKET_PATH = 100

# For throwaway test clusters only: a crash may lose or corrupt data, which tests never reuse.
_NON_DURABLE_SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")


class LocalPostgres(ServerProcess):
    """A PostgreSQL cluster in ``data_dir`` served on 127.0.0.1.

    The postmaster is started directly (not daemonised through pg_ctl) so this object owns
    its lifetime. It runs in its own session: a Ctrl-C meant for ``evora dev`` must not
    shut the database down underneath services that are still draining.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        *,
        durable: bool = True,
        log_path: Path | None = None,
        bin_dir: Path | None = None,
        start_timeout: float = 60.0,
        stop_timeout: float = 30.0,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.durable = durable
        self.log_path = (
            Path(log_path) if log_path else self.data_dir.with_name(self.data_dir.name + ".log")
        )
        self._bin_dir = bin_dir
        self._port = port
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._socket_dir: Path | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise EmbeddedServerError("no port chosen yet: call start() first")
        return self._port

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{quote(database, safe='')}"

    def start(self) -> None:
        if self.running:
            raise EmbeddedServerError(f"PostgreSQL for {self.data_dir} is already started")
        self.stop()  # reaps a server that died on its own and removes its socket directory
        bin_dir = self._bin_dir or find_bin_dir()
        account = server_account()
        self._prepare_dirs(bin_dir, account)
        self._refuse_if_running()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(bin_dir, account)
        if self._port is None:
            # Chosen once and kept, so dsn() stays valid across stop() and start().
            self._port = free_loopback_port()
        self._socket_dir = self._make_socket_dir(account)
        settings = ["listen_addresses=127.0.0.1", "max_connections=200"]
        if not self.durable:
            settings.extend(_NON_DURABLE_SETTINGS)
        cmd = [str(bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self._port)]
        cmd += ["-k", str(self._socket_dir) if self._socket_dir else ""]
        for setting in settings:
            cmd += ["-c", setting]
        try:
            with self.log_path.open("ab") as log:
                self._proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd="/",
                    start_new_session=True,
                    **_as_account(account),
                )
            self._wait_until_ready(self._proc)
        except BaseException:
            self.stop()
            raise
        # A forgotten stop() must not leave a postmaster behind after a normal exit.
        atexit.register(self.stop)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            atexit.unregister(self.stop)
            # SIGINT is PostgreSQL's "fast" shutdown: sessions are cut, a checkpoint is written.
            stop_process(proc, signal.SIGINT, self._stop_timeout)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    def _prepare_dirs(self, bin_dir: Path, account: RunAs | None) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if account is None:
            return
        wheel_root = wheel_install_root()
        if wheel_root is not None and bin_dir.is_relative_to(wheel_root):
            make_tree_readable(wheel_root)
        make_reachable(bin_dir, account)
        make_reachable(self.data_dir, account)
        if self.data_dir.stat().st_uid != account.uid:
            os.chown(self.data_dir, account.uid, account.gid)

    def _refuse_if_running(self) -> None:
        pid_file = self.data_dir / "postmaster.pid"
        try:
            first_line = pid_file.read_text().split("\n", 1)[0].strip()
        except FileNotFoundError:
            return
        if not first_line.isdigit() or not _is_postgres_process(int(first_line)):
            # PostgreSQL itself refuses to start while the recorded pid is alive, even when
            # that pid now belongs to an unrelated process (common after a container restart).
            pid_file.unlink(missing_ok=True)
            return
        raise EmbeddedServerError(
            f"a PostgreSQL server (pid {first_line}) is already running for {self.data_dir}; "
            f"stop it (kill -INT {first_line}) or use another data directory"
        )

    def _initdb(self, bin_dir: Path, account: RunAs | None) -> None:
        cmd = [str(bin_dir / "initdb"), "-D", str(self.data_dir), "--auth=trust", "-U", "postgres"]
        cmd += ["-E", "UTF8", "--no-locale", "--no-instructions"]
        if not self.durable:
            cmd.append("--no-sync")
        result = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            cwd="/",
            timeout=self._start_timeout,
            check=False,
            **_as_account(account),
        )
        if result.returncode != 0:
            output = (result.stdout + result.stderr).splitlines()
            raise EmbeddedServerError(
                f"initdb failed for {self.data_dir} (exit {result.returncode}):\n"
                + lines_tail(output)
            )

    def _make_socket_dir(self, account: RunAs | None) -> Path | None:
        socket_dir = Path(tempfile.mkdtemp(prefix="evora-pg-"))
        if len(str(socket_dir / f".s.PGSQL.{self._port}")) > _MAX_SOCKET_PATH:
            # TCP is all we use; PostgreSQL accepts an empty -k as "no Unix socket".
            socket_dir.rmdir()
            return None
        if account is not None:
            make_reachable(socket_dir, account)
            os.chown(socket_dir, account.uid, account.gid)
        return socket_dir

    def _wait_until_ready(self, proc: subprocess.Popen[bytes]) -> None:
        # The postmaster marks postmaster.pid "ready" once it accepts connections; this is
        # the same signal pg_ctl -w waits for, and needs no client library or password.
        deadline = time.monotonic() + self._start_timeout
        pid_file = self.data_dir / "postmaster.pid"
        while True:
            code = proc.poll()
            if code is not None:
                raise EmbeddedServerError(
                    f"PostgreSQL exited with code {code} while starting; "
                    f"log {self.log_path}:\n{file_tail(self.log_path)}"
                )
            if _reports_ready(pid_file, proc.pid):
                return
            if time.monotonic() > deadline:
                raise EmbeddedServerError(
                    f"PostgreSQL did not accept connections within {self._start_timeout:.0f}s; "
                    f"log {self.log_path}:\n{file_tail(self.log_path)}"
                )
            time.sleep(0.02)


def _reports_ready(pid_file: Path, pid: int) -> bool:
    try:
        lines = pid_file.read_text().splitlines()
    except FileNotFoundError:
        return False
    # A hot standby accepting read-only connections says "standby" instead.
    return (
        len(lines) >= 8
        and lines[0].strip() == str(pid)
        and lines[7].strip() in ("ready", "standby")
    )


def _is_postgres_process(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
    except FileNotFoundError:
        # Without /proc (macOS) we cannot tell, so assume the worst; with it, the pid just exited.
        return not Path("/proc").is_dir()
    except OSError:
        return True


def _as_account(account: RunAs | None) -> dict[str, Any]:
    if account is None:
        return {}
    return {"user": account.uid, "group": account.gid, "extra_groups": []}
