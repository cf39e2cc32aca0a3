"""The README's first section gets a newcomer from a clone to a job completed by a worker:
its shell lines, read from README.md itself, run as written, in order, on a machine where
the default ports 8080 and 8081 are taken."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.cli.commands import REPO, clean_environment

# The first terminal's command prints this once every service listens.
UP = "Evora dev is up"
# What the lines use from the repository besides the code: the scripts, the example worker.
COPIED = ("README.md", "pyproject.toml", "scripts", "examples")


def first_section_blocks(readme: str) -> list[str]:
    """The ```bash blocks of the first `## ` section."""
    sections = re.split(r"^## ", readme, flags=re.MULTILINE)
    return re.findall(r"^```bash\n(.*?)^```", sections[1], flags=re.MULTILINE | re.DOTALL)


@pytest.fixture
def default_ports_taken() -> Iterator[None]:
    """8080 and 8081 held by someone else (or already taken on this machine)."""
    with ExitStack() as stack:
        for port in (8080, 8081):
            holder = stack.enter_context(socket.socket())
            try:
                holder.bind(("127.0.0.1", port))
                holder.listen()
            except OSError:
                pass  # taken already, which is the point
        yield


def _clone(target: Path) -> None:
    """What a clone holds for these lines, with a .venv that `scripts/run.sh` finds complete:
    this test's interpreter and packages, and this tree's code; installing them takes
    minutes and the network, and is measured apart (docs, the final report)."""
    target.mkdir()
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, target / name)
        else:
            shutil.copy(source, target / name)
    venv = target / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = (venv / "lib").glob("python3*/site-packages")
    paths = [REPO / "shared", REPO, Path(sysconfig.get_paths()["purelib"])]
    (site / "evora_test_paths.pth").write_text("".join(f"{p}\n" for p in paths))
    evora = venv / "bin" / "evora"
    evora.write_text(
        f"#!{venv / 'bin' / 'python'}\n"
        "import sys\nfrom evora_services.cli import main\nsys.exit(main())\n"
    )
    evora.chmod(0o755)
    # The embedded MongoDB-wire server is a program of its package, found beside python.
    mongo_server = Path(sys.executable).parent / "secantusd-py"
    (venv / "bin" / mongo_server.name).symlink_to(mongo_server)
    digest = hashlib.sha256((target / "pyproject.toml").read_bytes()).hexdigest()
    (venv / ".evora-installed-local").write_text(digest + "\n")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_the_first_section_runs_as_written(tmp_path: Path, default_ports_taken: None) -> None:
    first_terminal, second_terminal = first_section_blocks((REPO / "README.md").read_text())
    clone = tmp_path / "evora"
    _clone(clone)
    env = clean_environment()
    env.pop("PYTHONPATH")  # the clone's .venv alone says where the code is
    log = tmp_path / "first-terminal.log"
    with log.open("wb") as log_file:
        system = subprocess.Popen(
            ["bash", "-c", first_terminal],
            cwd=clone,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while UP not in log.read_text(errors="replace"):
            assert system.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.2)
        banner = log.read_text(errors="replace")
        assert "dashboard   http://127.0.0.1:" in banner
        assert "evora worker examples.worker_example --queues demo" in banner
        second = subprocess.Popen(
            ["bash", "-e", "-c", second_terminal],
            cwd=clone,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out_bytes, err_bytes = second.communicate(timeout=120)
        finally:
            _stop(second)  # the worker too, should the lines have stopped before `kill %1`
        out, err = out_bytes.decode(), err_bytes.decode()
        assert second.returncode == 0, out + err
        assert re.search(r"^state\s+COMPLETED$", out, re.MULTILINE), out
        assert re.search(r'^result\s+\{"hello":"world"\}$', out, re.MULTILINE), out
        assert re.search(r"\bcompleted\b", out), out  # the events
        # The default ports were taken, so the system runs elsewhere and said where.
        env_file = (clone / ".evora" / "env").read_text()
        assert "EVORA_API_URL=http://127.0.0.1:8080\n" not in env_file
    finally:
        _stop(system)
    assert not (clone / ".evora" / "env").exists()  # removed when evora dev stopped
