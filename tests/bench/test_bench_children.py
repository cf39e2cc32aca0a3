"""What a benchmark's child process that failed is reported with: CI's output keeps little
of a long message, so its first line carries the exit code and the child's last log line."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bench.children import Children

# A traceback ends with the line that says what went wrong; lines of output come before it.
FAILING = """
import sys
print("READY", flush=True)
for i in range(30):
    print(f"working {i}", flush=True)
raise SystemExit("worker: error: the following arguments are required: queue")
"""


def test_the_first_line_of_a_failure_has_the_exit_code_and_the_last_log_line(
    tmp_path: Path,
) -> None:
    children = Children(tmp_path)
    child = children.spawn("worker", [sys.executable, "-c", FAILING], dict(os.environ))
    assert child.popen.wait(30) == 1

    message = str(child.failed("exited while draining"))

    first, *rest = message.splitlines()
    assert first == (
        "worker exited while draining (exit 1): "
        "worker: error: the following arguments are required: queue"
    )
    assert rest[-2:] == ["working 29", "worker: error: the following arguments are required: queue"]
    assert "READY" not in rest  # only the end of the log: 20 lines
