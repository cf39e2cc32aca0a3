""".evora/env holds what a shell needs to use `evora dev`: the services' URLs and tokens and
the embedded databases' URLs (psql, `evora.sql_enqueue`, the pipeline); a shell that sourced it can
start `evora dev` again."""

from __future__ import annotations

import shlex
import socket
import subprocess
from pathlib import Path

from tests.cli.commands import EVORA, clean_environment, stop_group, wait_until_up


def _free_ports() -> dict[str, str]:
    ports = {}
    for name in ("API", "DISPATCHER", "SWEEPER", "PROJECTOR"):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports[f"EVORA_{name}_PORT"] = str(probe.getsockname()[1])
    return ports


def _dev_exports(tmp_path: Path, env: dict[str, str], run: int) -> dict[str, str]:
    """Starts `evora dev`, returns what its env file exports, and stops it."""
    log = tmp_path / f"dev-{run}.log"
    with log.open("wb") as log_file:
        system = subprocess.Popen(
            [*EVORA, "dev"],
            cwd=tmp_path,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        banner = wait_until_up(system, log)
        exports = {}
        for line in (tmp_path / ".evora" / "env").read_text().splitlines():
            name, value = shlex.split(line.removeprefix("export "))[0].split("=", 1)
            exports[name] = value
        assert f"  export EVORA_DATABASE_URL={exports['EVORA_DATABASE_URL']}" in banner
        return exports
    finally:
        stop_group(system)


def test_the_env_file_has_the_database_urls_and_a_sourcing_shell_restarts_dev(
    tmp_path: Path,
) -> None:
    env = clean_environment({"EVORA_DATA_DIR": str(tmp_path / ".evora"), **_free_ports()})
    first = _dev_exports(tmp_path, env, 1)
    assert first["EVORA_DATABASE_URL"].startswith("postgresql://postgres@127.0.0.1:")
    assert first["EVORA_MONGO_URL"].startswith("mongodb://127.0.0.1:")
    assert first["EVORA_MONGO_DB"] == "evora"
    # A shell that ran `. .evora/env` names the embedded databases, which are stopped now:
    # `evora dev` from there starts them again, with the data of the first run.
    again = _dev_exports(tmp_path, {**env, **first}, 2)
    assert again == first
    assert not (tmp_path / ".evora" / "env").exists()
