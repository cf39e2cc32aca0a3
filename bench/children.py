"""Processes the benchmark starts: each logs to a file, runs in its own session (a Ctrl-C
reaches only the benchmark, which stops them in order) and is stopped whatever happens."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import procstats
from bench.runnerkit import READY_LINE

STOP_TIMEOUT_S = 30.0
# How much of a failed child's last log line the first line of the error quotes.
LAST_LINE_CHARS = 300


class ChildFailed(RuntimeError):
    pass


@dataclass(eq=False)
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def cpu(self) -> float:
        return procstats.cpu_seconds(self.pid) or 0.0

    def peak_rss_kib(self) -> int:
        return procstats.status_kib(self.pid, "VmHWM") or 0

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def failed(self, what: str) -> ChildFailed:
        """The error's first line is all a CI summary may keep of it: there the exit code and
        the log's last line (an exception or a usage error, as a rule), then the tail."""
        tail = self.log_tail()
        lines = [line.strip() for line in tail.splitlines() if line.strip()]
        last = lines[-1][:LAST_LINE_CHARS] if lines else "(no output)"
        head = f"{self.name} {what} (exit {self.popen.poll()}): {last}"
        return ChildFailed(f"{head}\n--- the end of its log:\n{tail}")

    async def wait_ready_line(self, limit_s: float = 60.0) -> None:
        """Until the process has printed `READY` on a line of its own."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if READY_LINE in self.log.read_text(errors="replace").splitlines():
                    return
            if not self.alive():
                raise self.failed("exited before it was ready")
            await asyncio.sleep(0.02)
        raise self.failed(f"not ready after {limit_s:.0f} s")

    async def wait_exit(self, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while self.alive():
            if time.monotonic() > deadline:
                raise self.failed(f"still running after {limit_s:.0f} s")
            await asyncio.sleep(0.02)
        if self.popen.returncode != 0:
            raise self.failed("failed")

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (a graceful stop for every process here), SIGKILL after `timeout`."""
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            print(f"  ({self.name} did not stop within {timeout:.0f} s: killed)")
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            self.popen.wait()


class Children:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.all: list[Child] = []

    def spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None = None
    ) -> Child:
        log = self.directory / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=cwd or self.directory,
                start_new_session=True,
            )
        child = Child(name, popen, log)
        self.all.append(child)
        return child

    def stop_all(self) -> None:
        for child in reversed(self.all):
            child.stop()
