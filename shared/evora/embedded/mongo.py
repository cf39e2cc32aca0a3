"""A MongoDB-wire server (SecantusDB's ``secantusd-py``) run as our child process.

Used by ``evora dev`` and the tests when no real MongoDB is configured. SecantusDB is GPL
and lives in the dev extra only, so it is started as a separate program, never imported.
"""

from __future__ import annotations

import atexit
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import IO

from evora.embedded._process import (
    EmbeddedServerError,
    ServerProcess,
    lines_tail,
    stop_process,
)

_EXECUTABLE = "secantusd-py"
_LISTENING = re.compile(r"listening on [0-9.]+:(\d+)")
_IN_MEMORY = ":memory:"


def find_secantusd() -> str:
    # Beside the interpreter first: a venv's scripts are there even when it is not activated.
    beside = Path(sys.executable).parent / _EXECUTABLE
    if beside.is_file():
        return str(beside)
    found = shutil.which(_EXECUTABLE)
    if found is None:
        raise EmbeddedServerError(
            f"{_EXECUTABLE} (the MongoDB-wire server for evora dev and the tests) is not "
            "installed: install the local extra with pip install -e '.[local]'"
        )
    return found


class LocalMongo(ServerProcess):
    """``secantusd-py`` serving ``storage_path`` on 127.0.0.1; ``":memory:"`` is a scratch store."""

    def __init__(
        self,
        storage_path: Path | str,
        port: int | None = None,
        *,
        cache_size: str = "256M",
        log_path: Path | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 15.0,
    ) -> None:
        self.storage_path: Path | str = (
            storage_path if storage_path == _IN_MEMORY else Path(storage_path).resolve()
        )
        self.log_path = log_path
        self._requested_port = port
        self._cache_size = cache_size
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._port: int | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._drainer: threading.Thread | None = None
        self._recent: deque[str] = deque(maxlen=50)

    @property
    def port(self) -> int:
        if self._port is None:
            raise EmbeddedServerError("secantusd-py is not running: call start() first")
        return self._port

    @property
    def url(self) -> str:
        return self.url_at(self.port)

    @staticmethod
    def url_at(port: int) -> str:
        """The URL of a server on `port`, running or not."""
        return f"mongodb://127.0.0.1:{port}/?directConnection=true"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The server's process while it runs (it leads its own process group)."""
        return self._proc.pid if self.running and self._proc is not None else None

    def start(self) -> None:
        if self.running:
            raise EmbeddedServerError(f"secantusd-py for {self.storage_path} is already started")
        self.stop()  # reaps a server that died on its own
        cwd = "/"
        if isinstance(self.storage_path, Path):
            self.storage_path.mkdir(parents=True, exist_ok=True)
            # secantusd-py reads ./secantusd.toml when present; the store is a neutral place.
            cwd = str(self.storage_path)
        cmd = [find_secantusd(), "--host", "127.0.0.1", "--port", str(self._requested_port or 0)]
        cmd += ["--storage-path", str(self.storage_path), "--cache-size", self._cache_size]
        self._recent.clear()
        log = self.log_path.open("a", encoding="utf-8") if self.log_path else None
        self._proc = proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            # Our own session, so a terminal's Ctrl-C reaches only us and we stop it in order.
            start_new_session=True,
        )
        assert proc.stdout is not None
        listening = threading.Event()
        # The pipe must be read for the server's whole life, or it blocks once the pipe fills.
        self._drainer = threading.Thread(
            target=self._drain,
            args=(proc.stdout, listening, log),
            name=f"secantusd-py-{proc.pid}",
            daemon=True,
        )
        self._drainer.start()
        ended = listening.wait(self._start_timeout)
        if self._port is not None:
            # A forgotten stop() must not leave a server behind after a normal exit.
            atexit.register(self.stop)
            return
        self.stop()
        reason = (
            f"exited with code {proc.returncode}"
            if ended
            else f"did not report listening within {self._start_timeout:.0f}s"
        )
        raise EmbeddedServerError(
            f"secantusd-py {reason} (storage {self.storage_path}):\n{lines_tail(self._recent)}"
        )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            atexit.unregister(self.stop)
            stop_process(proc, signal.SIGTERM, self._stop_timeout)
        if self._drainer is not None:
            self._drainer.join(timeout=5)
            self._drainer = None
        self._port = None

    def _drain(self, stream: IO[str], listening: threading.Event, log: IO[str] | None) -> None:
        try:
            for line in stream:
                self._recent.append(line.rstrip("\n"))
                if log is not None:
                    log.write(line)
                    log.flush()
                if not listening.is_set():
                    match = _LISTENING.search(line)
                    if match is not None:
                        self._port = int(match.group(1))
                        listening.set()
        finally:
            # End of output means the server exited; wake start() instead of letting it time out.
            listening.set()
            stream.close()
            if log is not None:
                log.close()
