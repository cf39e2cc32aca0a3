"""Running the real `evora` command in a child process, as a user's shell would."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EVORA = [sys.executable, "-m", "evora_services.cli"]


def clean_environment(extra: Mapping[str, str] = {}) -> dict[str, str]:
    """This process's environment without any EVORA_* variable, plus `extra`. The venv's
    editable install makes the source tree importable; a PYTHONPATH would only shadow it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVORA_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


def evora(
    *args: str, env: Mapping[str, str] = {}, cwd: Path | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EVORA, *args],
        env=clean_environment(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def evora_async(*args: str, env: Mapping[str, str] = {}) -> subprocess.CompletedProcess[str]:
    """`evora` while this event loop goes on serving (the servers of the test run in it)."""
    process = await asyncio.create_subprocess_exec(
        *EVORA,
        *args,
        env=clean_environment(env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return subprocess.CompletedProcess(list(args), process.returncode, out.decode(), err.decode())


def one_line(stderr: str) -> str:
    """The single line a failing command printed; fails when there are more (a traceback)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


# `evora dev` prints this once every service listens.
UP = "Evora dev is up"


def wait_until_up(process: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> str:
    """The output `process` (an `evora dev`, or what starts one) wrote to `log` once it is
    up; fails showing it when the process ended or took longer than `timeout`."""
    deadline = time.monotonic() + timeout
    while UP not in log.read_text(errors="replace"):
        assert process.poll() is None, log.read_text(errors="replace")
        assert time.monotonic() < deadline, log.read_text(errors="replace")
        time.sleep(0.2)
    return log.read_text(errors="replace")


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to a process started with `start_new_session=True` and its children."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
