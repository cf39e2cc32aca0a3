"""CPU time and memory of processes and of the machine, read from /proc (Linux only, as the
benchmarks are): the benchmark package and bench/store.py both measure with these."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses; fields resume after the last ')'.
    # From there ppid is [1], utime [11], stime [12], cutime [13], cstime [14].
    return text[text.rindex(")") + 2 :].split()


def own_cpu_seconds() -> float:
    """User + system CPU of this process so far."""
    times = os.times()
    return times.user + times.system


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU of one live process (its threads included)."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def children_of(pid: int) -> list[int]:
    return children_by_parent().get(pid, [])


def children_by_parent() -> dict[int, list[int]]:
    """Every live process's children, from one pass over /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                tree.setdefault(int(fields[1]), []).append(int(entry.name))
    return tree


def cluster_cpu_seconds(postmaster: int) -> float:
    """CPU of a PostgreSQL cluster: the postmaster, its live children and those it reaped
    (backends of closed connections count through the postmaster's cutime/cstime)."""
    own = _stat_fields(postmaster)
    if own is None:
        return 0.0
    ticks = sum(int(own[i]) for i in (11, 12, 13, 14))
    for child in children_of(postmaster):
        fields = _stat_fields(child)
        if fields is not None:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / _CLOCK_TICKS


def postmaster_pid(data_dir: Path) -> int | None:
    """The postmaster of the PostgreSQL cluster in `data_dir`, if it runs."""
    with contextlib.suppress(OSError, ValueError):
        return int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    return None


def status_kib(pid: int, key: str) -> int | None:
    """A `kB` field of /proc/<pid>/status: VmHWM is the peak resident set, VmRSS the current."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def cluster_anon_kib(postmaster: int) -> int:
    """Private (anonymous) memory of a PostgreSQL cluster: RssAnon summed over its processes.
    Shared memory (shared_buffers, the same size for every system) is left out: how much of
    it a process has touched depends on what ran before, not on the system measured."""
    pids = [postmaster, *children_of(postmaster)]
    return sum(status_kib(pid, "RssAnon") or 0 for pid in pids)


def machine_busy_seconds() -> float:
    """CPU seconds every process of the machine spent (first line of /proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    # cpu user nice system idle iowait irq softirq steal ...: all but idle and iowait.
    return sum(int(v) for i, v in enumerate(fields[1:9]) if i not in (3, 4)) / _CLOCK_TICKS


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def memory_total_gib() -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    return 0.0


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg prints them."""
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "unknown"
