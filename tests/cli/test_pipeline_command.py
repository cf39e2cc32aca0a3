"""`evora pipeline` on a developer's machine: it finds a running `evora dev` by its env file,
takes durations for `--older-than`, and says in one line what to install when PySpark or
Java is missing (each run here as a user runs it, in a child process)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from evora.config import Settings
from evora_services.cli import _parser
from evora_services.cli.dev import ENV_FILE, with_dev_urls, write_env_file
from tests.cli.commands import clean_environment, evora, one_line

DEV_MONGO = "mongodb://127.0.0.1:1"


def dev_env_file(data_dir: Path, database_url: str) -> Path:
    """The env file a running `evora dev` leaves in its data directory."""
    data_dir.mkdir()
    path = data_dir / ENV_FILE
    write_env_file(
        path,
        {
            "EVORA_API_URL": "http://127.0.0.1:1",
            "EVORA_DATABASE_URL": database_url,
            "EVORA_MONGO_URL": DEV_MONGO,
            "EVORA_MONGO_DB": "dev db's name",
        },
    )
    return path


def test_the_pipeline_takes_the_databases_of_a_running_evora_dev(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev_env_file(tmp_path / "data", "postgresql://evora@127.0.0.1:9/evora")
    found = with_dev_urls(Settings(data_dir=tmp_path / "data"))
    assert found.database_url == "postgresql://evora@127.0.0.1:9/evora"
    assert found.mongo_url == DEV_MONGO
    assert found.mongo_db == "dev db's name"
    # what the environment names wins; nothing is taken without an env file
    monkeypatch.setenv("EVORA_MONGO_DB", "mine")
    chosen = with_dev_urls(Settings(data_dir=tmp_path / "data"))
    assert (chosen.mongo_db, chosen.mongo_url) == ("mine", DEV_MONGO)
    mine = Settings(data_dir=tmp_path / "data", database_url="postgresql://me@db/x")
    assert with_dev_urls(mine) == mine
    assert with_dev_urls(Settings(data_dir=tmp_path / "none")).database_url is None


def test_evora_pipeline_run_reaches_the_dev_databases_without_sourcing_the_env_file(
    tmp_path: Path, db_url: str
) -> None:
    """No EVORA_DATABASE_URL: the dev stack's is taken (so the first thing missing is Java
    here), and without a dev stack the message says how to get one."""
    env = {"EVORA_DATA_DIR": str(tmp_path / "data"), "PATH": "/nonexistent"}
    without = evora("pipeline", "run", env=env)
    assert without.returncode == 2
    line = one_line(without.stderr)
    assert "EVORA_DATABASE_URL is required" in line and "evora dev" in line

    dev_env_file(tmp_path / "data", db_url)
    result = evora("pipeline", "run", env=env)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "Spark needs Java 17 or newer" in last, result.stderr


def test_without_pyspark_the_pipeline_names_the_extra_to_install(
    tmp_path: Path, db_url: str
) -> None:
    # pyspark made unimportable for that interpreter only
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['pyspark'] = None\n")
    env = clean_environment({"EVORA_DATABASE_URL": db_url})
    env["PYTHONPATH"] = ":".join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    result = evora("pipeline", "archive", "--older-than", "0s", env=env)
    assert result.returncode == 2, result.stderr
    line = one_line(result.stderr)
    assert "needs PySpark" in line
    assert "pip install 'evora-queue[pipeline]'" in line
    assert "bash scripts/run.sh --with-pipeline" in line


def test_java_home_pointing_nowhere_names_the_packages_to_install(db_url: str) -> None:
    result = evora(
        "pipeline", "archive", env={"EVORA_DATABASE_URL": db_url, "JAVA_HOME": "/nonexistent"}
    )
    assert result.returncode == 2, result.stderr
    line = one_line(result.stderr)
    assert "JAVA_HOME=/nonexistent has no bin/java" in line
    for package in ("default-jre-headless", "openjdk-17-jre-headless", "brew install openjdk@17"):
        assert package in line


@pytest.mark.parametrize(
    ("given", "seconds"),
    [("0", 0.0), ("0s", 0.0), ("90s", 90.0), ("1h", 3600.0), ("30d", 2592000.0)],
)
def test_older_than_takes_a_duration(given: str, seconds: float) -> None:
    args = _parser().parse_args(["pipeline", "archive", "--older-than", given])
    assert args.older_than == seconds


@pytest.mark.parametrize("given", ["-1s", "1w", "soon", "", "nan", "inf"])
def test_older_than_refuses_what_is_not_a_duration(
    given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        _parser().parse_args(["pipeline", "archive", f"--older-than={given}"])
    assert exit.value.code == 2
    assert "is not a duration such as 0s, 90s, 1h or 30d" in capsys.readouterr().err


def test_the_default_stays_the_retention_setting() -> None:
    args = _parser().parse_args(["pipeline", "archive"])
    assert isinstance(args, argparse.Namespace) and args.older_than is None
