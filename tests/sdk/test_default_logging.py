"""A plain `worker.run()` logs readable INFO lines when the program configured no logging,
and leaves a program's own logging configuration alone."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

from tests.cli.commands import clean_environment

TOKEN = "a-worker-token-000000"
# A worker that stops itself a moment after it started (its dispatcher is not there).
WORKER = f"""
import os, signal, threading
import evora

worker = evora.Worker("http://127.0.0.1:9", "{TOKEN}", ["mail"], blocked_loop_warning=None)

@worker.handler("mail.send")
async def send(job):
    return None

threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
worker.run()
"""
OURS = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z INFO evora\.worker: ", re.MULTILINE)


def _run(prelude: str) -> str:
    script = textwrap.dedent(prelude) + WORKER
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_a_program_without_logging_gets_info_lines() -> None:
    stderr = _run("")
    assert OURS.search(stderr), stderr
    assert "claiming mail.send from queues mail at http://127.0.0.1:9" in stderr
    assert "SIGTERM: stopping" in stderr
    assert TOKEN not in stderr


def test_a_program_s_own_logging_is_left_alone() -> None:
    stderr = _run(
        """
        import logging
        logging.basicConfig(format="APP %(levelname)s %(name)s %(message)s", level=logging.INFO)
        """
    )
    assert re.search(r"^APP INFO evora\.worker worker .* claiming mail\.send", stderr, re.M)
    assert not OURS.search(stderr), stderr
