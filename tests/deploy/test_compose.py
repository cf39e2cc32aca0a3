"""docker-compose.yml, the Dockerfiles, the Prometheus scrape configuration and the Grafana
provisioning: they parse, and what they reference exists (no Docker engine here)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import artifacts

EVORA_IMAGE = "${EVORA_IMAGE:-evora:local}"
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = artifacts.load_yaml(artifacts.COMPOSE)
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict)
    return doc


def evora_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if s.get("image") == EVORA_IMAGE}


def test_every_evora_container_runs_an_existing_command(compose: dict[str, Any]) -> None:
    services = evora_services(compose)
    commands = {name: service["command"] for name, service in services.items()}
    subcommands = artifacts.evora_subcommands()
    for name, command in commands.items():
        assert isinstance(command, list) and command, name
        assert command[0] in subcommands, f"{name}: `evora {command[0]}` does not exist"
        assert services[name]["build"]["dockerfile"] == "deploy/Dockerfile"
        if command[0] == "worker":
            importlib.import_module(command[1])  # the handlers module is importable
    ran = sorted(c[0] for c in commands.values())
    assert ran == sorted(
        ["migrate", "api", "dispatcher", "dispatcher", "sweeper", "projector", "worker"]
    )


def test_start_order_converges(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert re.fullmatch(r"postgres:(1[6-9]|[2-9][0-9])(\..*)?", services["postgres"]["image"])
    assert services["mongo"]["image"] == "mongo:7"
    for name, service in services.items():
        for dependency, rule in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert rule["condition"] in CONDITIONS, name
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"
    assert services["migrate"]["restart"] == "no"
    for name, service in evora_services(compose).items():
        if service["command"][0] in artifacts.SERVICES:
            port = artifacts.SERVICES[service["command"][0]]
            test = " ".join(service["healthcheck"]["test"])
            assert f"127.0.0.1:{port}/readyz" in test, name
            deps = service["depends_on"]
            assert deps["migrate"]["condition"] == "service_completed_successfully", name
    # Nothing is published beyond the host's loopback.
    for name, service in services.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port}"


def test_prometheus_scrapes_every_service(compose: dict[str, Any]) -> None:
    config = artifacts.load_yaml(artifacts.PROMETHEUS_CONFIG)
    targets = {
        job["job_name"]: {t for c in job["static_configs"] for t in c["targets"]}
        for job in config["scrape_configs"]
    }
    expected: dict[str, set[str]] = {}
    for name, service in evora_services(compose).items():
        command = service["command"][0]
        if command in artifacts.SERVICES:
            job = f"evora-{command}"
            expected.setdefault(job, set()).add(f"{name}:{artifacts.SERVICES[command]}")
    assert {job: targets.get(job) for job in expected} == expected
    rules = config["rule_files"]
    assert all((artifacts.PROMETHEUS_CONFIG.parent / r).exists() for r in rules)
    assert "alerts.yml" in rules


def test_grafana_is_provisioned(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    mounts = dict(volume.split(":")[:2] for volume in grafana["volumes"] if "./" in volume)
    for source in mounts:
        assert (artifacts.ROOT / source).exists(), source
    provisioning = artifacts.DEPLOY / "grafana" / "provisioning"
    (datasource,) = artifacts.load_yaml(provisioning / "datasources" / "prometheus.yml")[
        "datasources"
    ]
    assert datasource["url"] == "http://prometheus:9090"
    (provider,) = artifacts.load_yaml(provisioning / "dashboards" / "evora.yml")["providers"]
    container_dir = provider["options"]["path"]
    host_dir = next(h for h, c in mounts.items() if c == container_dir)
    boards = artifacts.dashboards()
    assert boards and set(boards) == {p.name for p in (artifacts.ROOT / host_dir).glob("*.json")}
    for name, board in boards.items():
        for panel in board["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"]["uid"] == datasource["uid"], f"{name}: {panel['title']}"
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).name in boards and Path(home).parent.as_posix() == container_dir


def test_dashboard_json_is_what_the_generator_writes() -> None:
    import runpy

    generator = runpy.run_path(str(artifacts.DEPLOY / "grafana" / "generate.py"))
    committed = (artifacts.DASHBOARDS / "evora.json").read_text()
    assert committed == generator["render"](), "run python deploy/grafana/generate.py"
    titles = [p["title"] for p in artifacts.dashboards()["evora.json"]["panels"]]
    assert len(titles) == len(set(titles)), "panel titles repeat"


# -- Dockerfiles ---------------------------------------------------------------------------


def _stages(dockerfile: Path) -> list[list[str]]:
    """Instructions (continuation lines joined) grouped by stage."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    stages: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def _ignored(dockerfile: Path) -> list[str]:
    return (dockerfile.parent / f"{dockerfile.name}.dockerignore").read_text().splitlines()


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.pipeline"])
def test_dockerfile_is_multi_stage_non_root_with_evora_entrypoint(name: str) -> None:
    dockerfile = artifacts.DEPLOY / name
    stages = _stages(dockerfile)
    assert len(stages) >= 2, "multi-stage"
    final = stages[-1]
    assert any(i.startswith("COPY --from=build /opt/evora /opt/evora") for i in final)
    assert 'ENTRYPOINT ["evora"]' in final
    users = [i.split()[1] for i in final if i.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    compilers = re.compile(r"\b(gcc|g\+\+|build-essential|make|clang|python3-dev|libpq-dev)\b")
    assert not [i for i in final if i.startswith("RUN") and compilers.search(i)]
    # Every COPY from the build context exists and survives the .dockerignore.
    allowed = [line[1:].rstrip("/") for line in _ignored(dockerfile) if line.startswith("!")]
    for stage in stages:
        for instruction in stage:
            if instruction.startswith("COPY ") and "--from=" not in instruction:
                sources = instruction.split()[1:-1]
                for source in sources:
                    assert (artifacts.ROOT / source).exists(), f"{name}: {source}"
                    assert any(source == a or source.startswith(a + "/") for a in allowed), (
                        f"{name}: {source} is excluded by the .dockerignore"
                    )
    if name == "Dockerfile.pipeline":
        runtime = " ".join(final)
        assert "openjdk-17-jre-headless" in runtime and "libpostgresql-jdbc-java" in runtime
        assert "/usr/share/java/postgresql.jar" in runtime
