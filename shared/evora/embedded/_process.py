"""Child-process plumbing shared by the embedded servers."""

from __future__ import annotations

import signal
import socket
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import Self


class EmbeddedServerError(RuntimeError):
    """An embedded server could not be found, started or stopped."""


class ServerProcess(ABC):
    """A server run as a child process; as a context manager, started on entry and stopped
    on exit."""

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def free_loopback_port() -> int:
    # The port is free only at this instant; the server binds it moments later, which is
    # a small race we accept rather than pre-binding and passing a socket we cannot hand over.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stop_process(
    proc: subprocess.Popen[bytes] | subprocess.Popen[str], sig: int, timeout: float
) -> None:
    """Send ``sig`` for an orderly shutdown; SIGKILL if it has not exited within ``timeout``."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(sig)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def file_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_bytes()[-64 * 1024 :].decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log {path} unreadable: {exc})"
    return lines_tail(text.splitlines(), lines)


def lines_tail(lines: Iterable[str], count: int = 30) -> str:
    kept = list(lines)[-count:]
    return "\n".join(kept) if kept else "(no output)"
