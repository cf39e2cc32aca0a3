"""The tokens the deployment files ship: docker-compose and the k8s dev overlay start with
their published example tokens (they allow them explicitly), and nothing else allows them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from evora.config import ConfigError, Settings, load_settings
from tests.deploy import artifacts
from tests.deploy.test_kubernetes import by_kind, render

ALLOW = "EVORA_ALLOW_EXAMPLE_TOKENS"


def _settings(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Settings:
    """The settings a container with exactly this EVORA_* environment loads."""
    for name in list(os.environ):
        if name.startswith("EVORA_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # no stray .env file
    return load_settings()


def _compose_default(value: str) -> str:
    """`${NAME:-default}` as compose resolves it with NAME unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def test_compose_starts_with_its_example_tokens(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    services = artifacts.load_yaml(artifacts.COMPOSE)["services"]
    envs = {
        name: {k: _compose_default(str(v)) for k, v in service["environment"].items()}
        for name, service in services.items()
        if "EVORA_TOKENS" in service.get("environment", {})
    }
    assert {"migrate", "api", "dispatcher-1", "sweeper", "projector"} <= set(envs)
    assert all(env[ALLOW] == "true" for env in envs.values())
    env = envs["api"]
    tokens = _settings(env, monkeypatch, tmp_path).token_roles()
    worker_token = _compose_default(services["worker"]["environment"]["EVORA_WORKER_TOKEN"])
    assert tokens[worker_token] == "worker"
    with pytest.raises(ConfigError, match="EVORA_TOKENS: entry 1 is an example token"):
        _settings({**env, ALLOW: "false"}, monkeypatch, tmp_path)


@pytest.mark.parametrize("overlay", artifacts.OVERLAYS, ids=lambda p: p.name)
def test_only_the_dev_overlay_allows_example_tokens(
    overlay: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    objects = render(overlay)
    config = by_kind(objects, "ConfigMap")["evora-config"]["data"]
    if not _builds_on_dev(overlay):
        assert ALLOW not in config
        return
    secret = by_kind(objects, "Secret")["evora-secrets"]["stringData"]
    env = {**config, **secret}
    assert env[ALLOW] == "true"
    tokens = _settings(env, monkeypatch, tmp_path).token_roles()
    assert tokens[secret["EVORA_WORKER_TOKEN"]] == "worker"
    with pytest.raises(ConfigError, match="EVORA_TOKENS: entry 1 is an example token"):
        _settings({**env, ALLOW: "false"}, monkeypatch, tmp_path)


def _builds_on_dev(overlay: Path) -> bool:
    """The dev overlay, or an example built on it (the worker-autoscaling ones): the dev
    install's example tokens come with it."""
    if overlay.name == "dev":
        return True
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    return "../dev" in kustomization.get("resources", [])
