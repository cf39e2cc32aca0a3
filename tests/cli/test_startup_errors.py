"""A command that cannot start says why in one line that says what to do, not a traceback."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.cli.commands import EVORA, clean_environment, evora, one_line

TOKENS = "admin:cli-admin-token-0000,producer:cli-producer-token-0,worker:cli-worker-token-00"


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_port_in_use_is_one_line_naming_its_variable(busy_port: int) -> None:
    result = evora(
        "api",
        env={
            "EVORA_HOST": "127.0.0.1",
            "EVORA_API_PORT": str(busy_port),
            "EVORA_TOKENS": TOKENS,
            "EVORA_DATABASE_URL": f"postgresql://u@127.0.0.1:{_closed_port()}/x",
            "EVORA_LOG_LEVEL": "ERROR",
        },
    )
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert f"port {busy_port} on 127.0.0.1 (EVORA_API_PORT) is already in use" in line


def test_an_unreachable_database_is_one_line() -> None:
    port = _closed_port()
    result = evora(
        "migrate", env={"EVORA_DATABASE_URL": f"postgresql://u:secret@127.0.0.1:{port}/x"}
    )
    assert result.returncode == 1
    line = one_line(result.stderr)
    where = f"127.0.0.1:{port}, database 'x'"
    assert line.startswith(f"evora migrate: cannot reach PostgreSQL ({where})")
    assert "start it or correct EVORA_DATABASE_URL" in line
    assert "secret" not in line


def test_a_missing_database_is_one_line(pg_server_url: str) -> None:
    url = urlunsplit(urlsplit(pg_server_url)._replace(path="/no_such_database_here"))
    result = evora("migrate", env={"EVORA_DATABASE_URL": url})
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert "the database does not exist" in line and "'no_such_database_here'" in line
    assert "create it" in line


def test_migrate_needs_no_tokens_and_takes_the_log_level_in_any_case(db_url: str) -> None:
    result = evora("migrate", env={"EVORA_DATABASE_URL": db_url, "EVORA_LOG_LEVEL": "debug"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "database is up to date"


def test_a_misspelt_variable_is_refused_with_the_name_meant(db_url: str) -> None:
    result = evora("migrate", env={"EVORA_DATABSE_URL": db_url})
    assert result.returncode == 2
    assert one_line(result.stderr) == (
        "evora: invalid configuration: EVORA_DATABSE_URL is not an Evora variable: "
        "did you mean EVORA_DATABASE_URL?"
    )


def test_an_unknown_variable_unlike_any_is_a_warning(db_url: str) -> None:
    result = evora(
        "migrate",
        env={"EVORA_DATABASE_URL": db_url, "EVORA_SOMETHING_ELSE": "1", "EVORA_LOG_FORMAT": "text"},
    )
    assert result.returncode == 0, result.stderr
    assert "WARNING evora: EVORA_SOMETHING_ELSE is not an Evora variable; it is ignored" in (
        result.stderr
    )


def test_a_second_evora_dev_on_the_same_data_dir_is_one_line(
    tmp_path: Path, db_url: str, mongo_url: str, mongo_db_name: str
) -> None:
    env = clean_environment(
        {
            "EVORA_DATA_DIR": str(tmp_path / "data"),
            "EVORA_DATABASE_URL": db_url,
            "EVORA_MONGO_URL": mongo_url,
            "EVORA_MONGO_DB": mongo_db_name,
        }
    )
    first = subprocess.Popen(
        [*EVORA, "dev"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert first.stdout is not None
        deadline = time.monotonic() + 60
        for line in first.stdout:  # the banner: the first one is up
            if line.startswith("Evora dev is up") or time.monotonic() > deadline:
                break
        second = evora("dev", env=env, cwd=tmp_path)
        assert second.returncode == 1
        line = one_line(second.stderr)
        assert f"evora dev is already running on {tmp_path / 'data'} (pid {first.pid})" in line
        assert "set EVORA_DATA_DIR to another directory" in line
    finally:
        first.terminate()
        first.wait(30)


def test_database_urls_with_tls_settings_are_taken(db_url: str) -> None:
    """Managed PostgreSQL is reached with libpq's sslmode in the URL; this server speaks no
    TLS, so `prefer` connects in clear and `require` is refused in one line."""
    preferred = evora("migrate", env={"EVORA_DATABASE_URL": f"{db_url}?sslmode=prefer"})
    assert preferred.returncode == 0, preferred.stderr
    required = evora("migrate", env={"EVORA_DATABASE_URL": f"{db_url}?sslmode=require"})
    assert required.returncode == 1
    line = one_line(required.stderr)
    assert "TLS" in line and "sslmode" in line


def test_the_pipeline_without_java_names_the_package_to_install(db_url: str) -> None:
    env = clean_environment({"EVORA_DATABASE_URL": db_url, "PATH": "/nonexistent"})
    env.pop("JAVA_HOME", None)
    result = subprocess.run(
        [*EVORA, "pipeline", "archive"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    line = one_line(result.stderr)
    assert "Spark needs Java 17 or newer" in line
    assert "apt-get install default-jre-headless or openjdk-17-jre-headless" in line
    assert "libpostgresql-jdbc-java" in line
