"""What the benchmark scripts share: CPU and memory read from /proc, and DSN helpers.

Linux only, as the benchmarks are: everything comes from /proc.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses; fields resume after the last ')'.
    # From there ppid is [1], utime [11], stime [12], cutime [13], cstime [14].
    return text[text.rindex(")") + 2 :].split()


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def process_cpu_seconds(pid: int) -> float | None:
    fields = _proc_stat(pid)
    if fields is None:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def status_kib(pid: int, key: str) -> int | None:
    """A `kB` field (VmHWM, VmRSS) of /proc/<pid>/status."""
    return kib_field(f"/proc/{pid}/status", key)


def cluster_cpu_seconds(postmaster_pid: int) -> float | None:
    """CPU of the postmaster, its live children and the children it has reaped."""
    own = _proc_stat(postmaster_pid)
    if own is None:
        return None
    ticks = sum(int(own[i]) for i in (11, 12, 13, 14))
    parent = str(postmaster_pid)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _proc_stat(int(entry.name))
        if fields is not None and fields[1] == parent:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / _CLOCK_TICKS


def machine_busy_seconds() -> float | None:
    """CPU seconds all processes of the machine spent, from the first line of /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...: everything but idle and iowait.
    busy = sum(int(v) for i, v in enumerate(fields[1:9]) if i not in (3, 4))
    return busy / _CLOCK_TICKS


def postmaster_pid_of(data_dir: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    return None


def with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


def kib_field(path: str, key: str) -> int | None:
    """A `key: N kB` line of a /proc file (meminfo, <pid>/status)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def memory_gib() -> str:
    kib = kib_field("/proc/meminfo", "MemTotal")
    return "unknown" if kib is None else f"{kib / 1024 / 1024:.1f} GiB"


def load_average() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "unknown"
