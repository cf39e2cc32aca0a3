"""k8s/components/tls-ingress: every Ingress of the production overlay serves TLS with a
certificate cert-manager issues, for the hosts it routes, to a Service port that exists,
and the dispatcher's proxy outwaits the longest long-poll."""

from __future__ import annotations

from typing import Any

from evora.protocol.bounds import MAX_WAIT_SECONDS
from tests.deploy import artifacts
from tests.deploy.test_kubernetes import render

Obj = dict[str, Any]


def _production() -> tuple[Obj, ...]:
    return render(artifacts.K8S / "overlays" / "production")


def _service_ports(objects: tuple[Obj, ...]) -> dict[str, set[str]]:
    return {
        o["metadata"]["name"]: {p["name"] for p in o["spec"]["ports"]}
        for o in objects
        if o["kind"] == "Service"
    }


def test_every_ingress_serves_tls_for_its_hosts_with_a_cert_manager_certificate() -> None:
    objects = _production()
    ingresses = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Ingress"}
    assert set(ingresses) == {"evora-api", "evora-dispatcher"}
    ports = _service_ports(objects)
    for name, ingress in ingresses.items():
        annotations = ingress["metadata"]["annotations"]
        assert annotations["cert-manager.io/cluster-issuer"], name
        assert annotations["nginx.ingress.kubernetes.io/ssl-redirect"] == "true", name
        spec = ingress["spec"]
        tls_hosts = {host for tls in spec["tls"] for host in tls["hosts"]}
        assert all(tls["secretName"] for tls in spec["tls"]), name
        routed = {rule["host"] for rule in spec["rules"]}
        assert routed == tls_hosts, f"{name}: a host without TLS, or TLS for no host"
        for rule in spec["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                assert backend["port"]["name"] in ports[backend["name"]], name


def test_the_dispatcher_proxy_outwaits_a_long_poll() -> None:
    [dispatcher] = [
        o
        for o in _production()
        if o["kind"] == "Ingress" and o["metadata"]["name"] == "evora-dispatcher"
    ]
    annotations = dispatcher["metadata"]["annotations"]
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) > MAX_WAIT_SECONDS
