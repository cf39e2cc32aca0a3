"""A worker's install of the SDK (the `evora-queue` wheel, no extras) into a clean virtualenv:
it is ours by name, the SDK works, and none of the server side's dependencies come with it."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER_ONLY = ("asyncpg", "pymongo", "pyspark", "prometheus_client", "pydantic_settings")

CHECK = textwrap.dedent(
    f"""
    import importlib.metadata, importlib.util, sys
    import evora

    # Only Evora's own names at the top level: a generic one (the services were once a
    # package called `services`) collides with users' modules of that name.
    files = importlib.metadata.files("evora-queue") or []
    tops = sorted({{f.parts[0] for f in files if f.suffix == ".py" and len(f.parts) > 1}})

    worker = evora.Worker("http://127.0.0.1:1", "a-worker-token-16", queues=["q"])

    @worker.handler("t")
    def handle(job):
        return job.payload

    client = evora.Client("http://127.0.0.1:1", "a-producer-token")
    present = [m for m in {SERVER_ONLY!r} if importlib.util.find_spec(m) is not None]
    loaded = [m for m in ("evora.storage", "evora.http", "evora_services") if m in sys.modules]
    print("tops", tops, "present", present, "loaded", loaded, "types", worker.handlers.types)
    print("version", importlib.metadata.version("evora-queue"))
    """
)


def project_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


# The clean virtualenv must see only what was installed into it, not a checkout on PYTHONPATH.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def local_wheels() -> list[str]:
    """pip's options to take the build backend and the SDK's dependencies from the wheels
    scripts/test.sh downloaded for the dev lock (scripts/_env.sh, _install_pinned) rather
    than from the index: asking the index for every package was most of this test's time.
    pip still resolves the SDK's dependencies itself; the folder also holds the server side's
    wheels, so the check below that none came along still means they were not asked for."""
    cache = os.environ.get("EVORA_WHEELS_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "evora" / "wheels"
    )
    lock = hashlib.sha256((ROOT / "scripts" / "locks" / "dev.txt").read_bytes()).hexdigest()
    wheels = Path(cache) / lock[:16]
    # Without them (a venv made some other way) pip asks the index, as before.
    return ["--no-index", "--find-links", str(wheels)] if (wheels / ".complete").exists() else []


def test_the_sdk_installs_and_works_without_the_server_side(tmp_path: Path) -> None:
    # Built from a copy, so the build leaves nothing in the working tree.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("shared", "services"):
        shutil.copytree(
            ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    # The wheel a release uploads (and `pip install` of a clone builds), under our name: the
    # `evora` on PyPI is an unrelated project.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            *local_wheels(),
            "-w",
            "dist",
            source,
        ],
        check=True,
        timeout=600,
        env=CLEAN_ENV,
        cwd=tmp_path,
    )
    [wheel] = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.startswith(f"evora_queue-{project_version()}-"), wheel.name
    # The two packages from their source roots, not the roots (`shared`, `services`)
    # themselves, with their data files.
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {name.split("/")[0] for name in names} == {
        "evora",
        "evora_services",
        f"evora_queue-{project_version()}.dist-info",
    }
    assert {
        "evora/tracing/__init__.py",
        "evora/storage/migrations/0001_initial.sql",
        "evora/storage/sql/audit.sql",
        "evora/storage/objects.txt",
        "evora/storage/rules.sql",
        "evora_services/api/app.py",
        "evora_services/api/dashboard/static/index.html",
        "evora_services/cli/__init__.py",
        "evora_services/cli/__main__.py",
        "evora_services/cli/admin/commands.py",
    } <= names
    # A clean venv without pip of its own (bootstrapping pip and setuptools into it took
    # seconds of CPU): this interpreter's pip installs into it (`--python`).
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *local_wheels(),
            wheel,
        ],
        check=True,
        timeout=600,
        env=CLEAN_ENV,
    )

    checked = subprocess.run(
        [str(python), "-c", CHECK],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=CLEAN_ENV,
        cwd=tmp_path,  # not the checkout: its egg-info would answer for the installed package
    )
    assert checked.stdout.splitlines() == [
        "tops ['evora', 'evora_services'] present [] loaded [] types ['t']",
        f"version {project_version()}",
    ], checked.stdout

    # The console script runs a worker module with the SDK alone (no such module: exit 2),
    # from a directory holding a user's own `services.py`.
    (tmp_path / "services.py").write_text("raise SystemExit('the user module was imported')\n")
    cli = subprocess.run(
        [str(venv / "bin" / "evora"), "worker", "no_such_module_here"],
        capture_output=True,
        text=True,
        timeout=120,
        env=CLEAN_ENV,
        cwd=tmp_path,
    )
    assert cli.returncode == 2, cli.stderr
    assert "cannot import no_such_module_here" in cli.stderr

    # A service needs the server extra, and says so in one line rather than a traceback.
    for command in ("dev", "api"):
        service = subprocess.run(
            [str(venv / "bin" / "evora"), command],
            capture_output=True,
            text=True,
            timeout=120,
            env=CLEAN_ENV,
            cwd=tmp_path,
        )
        assert service.returncode == 2, service.stderr
        [line] = service.stderr.strip().splitlines()
        assert line.startswith(f"evora {command}: needs the server extra (asyncpg, "), line
        assert "'evora-queue[server]'" in line

    # The operator commands run with the SDK alone too: an api that is not there is exit 6.
    operator = subprocess.run(
        [str(venv / "bin" / "evora"), "jobs", "list", "--url", "http://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "EVORA_ADMIN_TOKEN": "an-admin-token-0000"},
    )
    assert operator.returncode == 6, operator.stderr
    assert "cannot connect" in operator.stderr
