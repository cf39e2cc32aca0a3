from __future__ import annotations

import subprocess
import sys

import pytest

from evora.config import ConfigError, load_settings, parse_tokens


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("EVORA_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir("/")  # no stray .env file


def test_defaults_follow_the_contract() -> None:
    s = load_settings()
    assert (s.api_port, s.dispatcher_port, s.sweeper_port, s.projector_port) == (
        8080,
        8081,
        8082,
        8083,
    )
    assert s.mongo_db == "evora" and s.auth_enabled and s.host == "0.0.0.0"
    assert s.max_payload_bytes == 1048576
    assert s.archive_location.endswith("archive")


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("EVORA_API_PORT", "70000", "EVORA_API_PORT"),
        ("EVORA_DISPATCHER_PORT", "http", "EVORA_DISPATCHER_PORT"),
        ("EVORA_AUTH", "maybe", "EVORA_AUTH"),
        ("EVORA_DATABASE_URL", "mysql://x", "EVORA_DATABASE_URL: must be a postgresql:// URL"),
        ("EVORA_TOKENS", "root:abc", "EVORA_TOKENS: unknown role 'root'"),
        ("EVORA_TOKENS", "admin", "EVORA_TOKENS: 'admin' is not role:token"),
        ("EVORA_MAX_PAYLOAD_BYTES", "0", "EVORA_MAX_PAYLOAD_BYTES"),
    ],
)
def test_invalid_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_tokens_allow_several_per_role() -> None:
    assert parse_tokens("admin:a1, producer:p1,producer:p2 ,worker:w") == {
        "a1": "admin",
        "p1": "producer",
        "p2": "producer",
        "w": "worker",
    }
    with pytest.raises(ValueError, match="two roles"):
        parse_tokens("admin:same,worker:same")


def test_required_values_and_disabled_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="EVORA_DATABASE_URL is required"):
        load_settings().require("database_url")
    monkeypatch.setenv("EVORA_DATABASE_URL", "postgresql://localhost/x")
    with pytest.raises(ConfigError, match="EVORA_TOKENS is required"):
        load_settings().require("database_url")
    monkeypatch.setenv("EVORA_AUTH", "disabled")
    settings = load_settings()
    settings.require("database_url")
    assert settings.bind_host == "127.0.0.1"


def test_cli_exits_with_one_line_on_bad_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVORA_API_PORT", "not-a-port")
    done = subprocess.run(
        [sys.executable, "-m", "evora.cli", "migrate"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "EVORA_API_PORT" in done.stderr
