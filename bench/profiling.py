"""py-spy profiles of Python processes during a phase, and what they say in a few lines.

`py-spy record --nonblocking` samples without pausing the target, so profiling costs the
profiled process nothing but the profiler's own CPU (one more process on the two cores).
Stacks are written collapsed ("frame;frame;frame count"), then summarised as the functions
with the most samples on top of the stack (self) and the frames most often on it at
all (inclusive, below the event loop's own frames).
"""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from pathlib import Path

from bench.children import Child

RATE_HZ = 200


class Profiler:
    def __init__(self, pyspy: Path, directory: Path) -> None:
        self.pyspy = pyspy
        self.directory = directory
        self.running: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        directory.mkdir(parents=True, exist_ok=True)

    def attach(self, phase: str, targets: list[Child]) -> None:
        for child in targets:
            out = self.directory / f"{child.name}-{phase}.txt"
            popen = subprocess.Popen(
                [
                    str(self.pyspy),
                    "record",
                    "--pid",
                    str(child.pid),
                    "--rate",
                    str(RATE_HZ),
                    "--nonblocking",
                    "--format",
                    "raw",
                    "--output",
                    str(out),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=(self.directory / f"{child.name}-{phase}.log").open("wb"),
            )
            self.running.append((f"{child.name} {phase}", popen, out))

    def stop(self) -> dict[str, list[str]]:
        """Stops every profiler started since the last stop; a summary per profile."""
        summaries: dict[str, list[str]] = {}
        for _, popen, _ in self.running:
            popen.send_signal(signal.SIGINT)
        for label, popen, out in self.running:
            try:
                popen.wait(30)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
            summaries[label] = summarize(out) if out.exists() else ["(no profile written)"]
        self.running = []
        return summaries


def _frame(raw: str) -> str:
    # py-spy writes "function (path/to/module.py:line)": keep the function and file name.
    name, _, where = raw.partition(" (")
    file = where.rstrip(")").rsplit("/", 1)[-1].split(":")[0]
    return f"{name} ({file})" if file else name


def summarize(path: Path, top: int = 12) -> list[str]:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_frame(f) for f in stack.split(";")]
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if total == 0:
        return ["(no samples)"]
    lines = [f"{total} samples; self:"]
    lines += [f"  {100 * n / total:5.1f}% {frame}" for frame, n in own.most_common(top)]
    lines.append("inclusive (frames under 90% of the samples: below the event loop):")
    below_loop = [(f, n) for f, n in inclusive.most_common() if n < 0.9 * total]
    lines += [f"  {100 * n / total:5.1f}% {frame}" for frame, n in below_loop[:top]]
    return lines
