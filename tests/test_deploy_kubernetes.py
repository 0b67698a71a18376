"""deploy/kubernetes/: every manifest is valid against the Kubernetes schemas (kubernetes-validate,
offline, strict: an unknown field fails), the ConfigMap's ftpbc configuration passes the
configuration checks of ``ftpbc check``, and the StatefulSet agrees with it (grace period above
every drain_timeout, probes and scrape annotations on its metrics port, the node id from the
pod's name, the password file from the Secret).  No cluster runs here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ftpbc.config.loader import load_config
from ftpbc.node.check import lease_warning

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"
#: the oldest Kubernetes release these manifests are meant for, and the newest schemas shipped
VERSIONS = ["1.29.0", kubernetes_validate.utils.latest_version()]


def documents() -> list[tuple[str, dict[str, Any]]]:
    """Every manifest of kustomization.yaml's resources, as (file, document)."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    out = []
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            if doc is not None:
                out.append((name, doc))
    return out


def by_kind(kind: str) -> dict[str, Any]:
    found = [doc for _, doc in documents() if doc["kind"] == kind]
    assert len(found) == 1, (kind, len(found))
    return found[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(version: str) -> None:
    docs = documents()
    assert {doc["kind"] for _, doc in docs} >= {"ConfigMap", "Secret", "Service", "StatefulSet",
                                                "PodDisruptionBudget"}
    assert not sorted(p.name for p in K8S.glob("*.yaml")
                      if p.name != "kustomization.yaml"
                      and p.name not in yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    for _, doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
    # The validator does refuse: an unknown field, a wrong type.
    broken = by_kind("StatefulSet")
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 60
    with pytest.raises(kubernetes_validate.utils.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)
    broken = by_kind("StatefulSet")
    broken["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.utils.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)
    print(f"kubernetes-validate {version} (strict): {len(docs)} manifests valid "
          f"({', '.join(sorted(doc['kind'] for _, doc in docs))}); two broken copies refused")


def test_the_configmap_configuration_passes_the_checks_and_the_statefulset_agrees(tmp_path: Path) -> None:
    """The embedded configuration is loaded by ftpbc's loader as ``ftpbc check`` loads it (its
    password_file pointed at a file as the kubelet makes it: 0440), with no lease warning; the
    StatefulSet mounts and wires everything that configuration names."""
    text = by_kind("ConfigMap")["data"]["ftpbc.yaml"]
    declared = yaml.safe_load(text)
    secret_path = Path(declared["servers"]["exchange"]["password_file"])
    password = tmp_path / "password"
    password.write_text("from-the-secret\n")
    password.chmod(0o440)
    declared["servers"]["exchange"]["password_file"] = str(password)
    config_file = tmp_path / "ftpbc.yaml"
    config_file.write_text(yaml.safe_dump(declared))
    config = load_config(config_file, node_id="ftpbc-0")
    assert lease_warning(config) is None
    assert config.node.id == "ftpbc-0"
    assert config.servers["exchange"].password is not None
    assert config.servers["exchange"].password.get_secret_value() == "from-the-secret"
    assert config.node.metrics is not None and config.node.metrics.host == "0.0.0.0"

    sts = by_kind("StatefulSet")
    pod = sts["spec"]["template"]
    spec = pod["spec"]
    (container,) = spec["containers"]
    drains = [ep.drain_timeout for ep in config.endpoints.values()]
    grace = spec["terminationGracePeriodSeconds"]
    assert grace > max(drains), (grace, drains)

    # The node id is the pod's name (downward API), passed as --node-id.
    args = container["args"]
    assert args[args.index("--node-id") + 1] == "$(POD_NAME)"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"

    # Probes and Prometheus on the port the configuration serves metrics on.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == config.node.metrics.port
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    notes = pod["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/port"] == str(ports["metrics"])

    # Mounts: the configuration where --config reads it, the Secret where password_file points,
    # the per-pod volume holding the journal and state_dir.
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["config"]["mountPath"] == args[args.index("--config") + 1]
    assert volumes["config"]["configMap"]["name"] == by_kind("ConfigMap")["metadata"]["name"]
    assert Path(mounts["password"]["mountPath"]) == secret_path.parent
    assert volumes["password"]["secret"]["secretName"] == by_kind("Secret")["metadata"]["name"]
    assert secret_path.name in by_kind("Secret")["stringData"]
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    data = Path(mounts[claim["metadata"]["name"]]["mountPath"])
    assert config.node.journal_dir.is_relative_to(data) and config.node.state_dir.is_relative_to(data)

    # Non-root, read-only root filesystem (with a writable /tmp), nothing to escalate to.
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert mounts["tmp"]["mountPath"] == "/tmp" and "emptyDir" in volumes["tmp"]

    # The disruption budget and the governing service select these pods.
    labels = pod["metadata"]["labels"]
    assert by_kind("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert by_kind("Service")["spec"]["selector"].items() <= labels.items()
    assert sts["spec"]["serviceName"] == by_kind("Service")["metadata"]["name"]
    print(f"ConfigMap configuration loads as node ftpbc-0 with no lease warning; grace period {grace} s "
          f"> drain_timeout {max(drains):g} s; probes and scrape on port {ports['metrics']}; "
          f"journal and state_dir on the claim {claim['metadata']['name']!r}")
