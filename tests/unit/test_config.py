from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from evora.config import (
    EXAMPLE_TOKENS,
    MIN_TOKEN_LENGTH,
    ConfigError,
    Settings,
    load_settings,
    parse_tokens,
)
from evora_services import cli
from evora_services.cli.dev import _kept_tokens

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cret-value-nobody-may-see"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("EVORA_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir("/")  # no stray .env file


def test_defaults_are_the_documented_ones() -> None:
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
        ("EVORA_TOKENS", "root:abcdefghijklmnop", "EVORA_TOKENS: entry 1 has an unknown role"),
        ("EVORA_TOKENS", "admin", "EVORA_TOKENS: entry 1 is not role:token"),
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
    a1, p1, p2, w = (f"{name}-0123456789abcdef" for name in ("a1", "p1", "p2", "w"))
    assert parse_tokens(f"admin:{a1}, producer:{p1},producer:{p2} ,worker:{w}") == {
        a1: "admin",
        p1: "producer",
        p2: "producer",
        w: "worker",
    }


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        # The usual slip: a token without its role (or the colon), whole or reversed.
        (f"admin:{SECRET},producer-{SECRET}", "entry 2 is not role:token"),
        (f"admin:{SECRET},, {SECRET}", "entry 3 is not role:token"),
        (f"admin:{SECRET},{SECRET}:worker", "entry 2 has an unknown role"),
        ("producer:short-secret", "entry 1 has a token shorter than 16 characters"),
        (f"worker:{SECRET} tail", "entry 1 has a token with characters a Bearer token"),
        (f"admin:{SECRET},worker:{SECRET}", "entries 1 and 2 give the same token to two roles"),
        (f"admin:{SECRET},worker:example-worker-token", "entry 2 is an example token"),
        (" , ", "no role:token pairs"),
    ],
)
def test_bad_tokens_name_the_entry_never_the_secret(
    monkeypatch: pytest.MonkeyPatch, tokens: str, message: str
) -> None:
    monkeypatch.setenv("EVORA_TOKENS", tokens)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value).startswith(f"EVORA_TOKENS: {message}")
    for secret in (SECRET, "short-secret", "example-worker-token"):
        assert secret not in str(err.value)
    assert "\n" not in str(err.value)


def test_tokens_are_at_least_16_characters() -> None:
    assert MIN_TOKEN_LENGTH == 16
    parse_tokens("admin:" + "x" * 16)
    with pytest.raises(ValueError, match="shorter than 16"):
        parse_tokens("admin:" + "x" * 15)


def _shipped_tokens() -> set[str]:
    """Every token value written in the files people copy from: compose, k8s, the docs."""
    files = [REPO / "docker-compose.yml", REPO / "README.md", *REPO.glob("k8s/**/*.yaml")]
    files += [*REPO.glob("docs/**/*.md"), *REPO.glob("examples/**/*.py"), *REPO.glob("deploy/*")]
    value = r"([A-Za-z0-9._~+/-]*[A-Za-z0-9][A-Za-z0-9._~+/-]*=*)"  # not a "..." placeholder
    patterns = [
        rf"\b(?:admin|producer|worker):{value}",
        rf"Authorization: Bearer {value}",
        rf"EVORA_WORKER_TOKEN(?::-|: |=){value}",
    ]
    text = "\n".join(path.read_text() for path in files if path.is_file())
    return {found for pattern in patterns for found in re.findall(pattern, text)}


def test_every_shipped_example_token_is_refused_outside_dev() -> None:
    shipped = _shipped_tokens()
    # compose's three defaults, the k8s placeholders, the docs' curl: at least six values.
    assert len(shipped) >= 6, shipped
    assert shipped <= EXAMPLE_TOKENS
    for token in shipped:
        with pytest.raises(ConfigError, match="EVORA_TOKENS: entry 1 is an example token"):
            load_settings(tokens=f"worker:{token}")
        # ... yet valid, so that docker-compose and the k8s dev overlay, which set
        # EVORA_ALLOW_EXAMPLE_TOKENS=true, start with them.
        load_settings(tokens=f"worker:{token}", allow_example_tokens=True)


def test_example_tokens_allowed_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVORA_TOKENS", "admin:example-admin-token")
    with pytest.raises(ConfigError, match="EVORA_TOKENS: entry 1 is an example token"):
        load_settings()
    monkeypatch.setenv("EVORA_ALLOW_EXAMPLE_TOKENS", "true")
    assert load_settings().token_roles() == {"example-admin-token": "admin"}


def test_dev_accepts_example_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Settings] = []

    def run(args: object, settings: Settings) -> int:
        seen.append(settings)
        return 0

    monkeypatch.setattr(cli, "_dev", run)
    monkeypatch.setattr(cli, "configure_logging", lambda *args, **kwargs: None)
    monkeypatch.setenv("EVORA_TOKENS", "admin:example-admin-token")
    assert cli.main(["dev"]) == 0
    assert seen[0].token_roles() == {"example-admin-token": "admin"}
    monkeypatch.setattr(cli, "_api", run)
    assert cli.main(["api"]) == 2 and len(seen) == 1


def test_dev_generates_valid_tokens(tmp_path: Path) -> None:
    tokens = parse_tokens(_kept_tokens(tmp_path / "tokens"))
    assert sorted(tokens.values()) == ["admin", "producer", "worker"]
    assert not set(tokens) & EXAMPLE_TOKENS


def test_dev_tokens_never_look_like_an_option(tmp_path: Path) -> None:
    """A token that begins with "-" is taken for an option by `evora worker --token` (as
    argparse does); with token_urlsafe one in 64 did: these 1,200 made about 19 such."""
    for n in range(400):
        for token in parse_tokens(_kept_tokens(tmp_path / f"tokens-{n}")):
            assert not token.startswith("-")


def test_settings_repr_hides_the_tokens() -> None:
    settings = load_settings(tokens=f"admin:{SECRET}")
    assert SECRET not in repr(settings) and SECRET not in str(settings)


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
        [sys.executable, "-m", "evora_services.cli", "migrate"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "EVORA_API_PORT" in done.stderr


@pytest.mark.parametrize(
    ("tokens", "reason"),
    [
        (f"admin:{SECRET},worker{SECRET}", "EVORA_TOKENS: entry 2 is not role:token"),
        (f"admin:{SECRET},worker:example-worker-token", "EVORA_TOKENS: entry 2 is an example"),
    ],
)
def test_service_refuses_bad_tokens_without_printing_them(
    monkeypatch: pytest.MonkeyPatch, tokens: str, reason: str
) -> None:
    monkeypatch.setenv("EVORA_DATABASE_URL", "postgresql://nobody@127.0.0.1:9/none")
    monkeypatch.setenv("EVORA_TOKENS", tokens)
    done = subprocess.run(
        [sys.executable, "-m", "evora_services.cli", "api"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"evora: invalid configuration: {reason}")
    assert done.stderr.strip().count("\n") == 0
    output = done.stdout + done.stderr
    assert SECRET not in output and "example-worker-token" not in output
