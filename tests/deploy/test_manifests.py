"""deploy/ YAML: every file parses; built-in objects carry only fields Kubernetes knows (checked
against kubernetes-asyncio's generated models, a complete schema of the built-in kinds); names
referenced between objects exist; the worker Deployments follow the conventions of the brief."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import models

from tests.deploy.conftest import (
    DEPLOY,
    EXAMPLES,
    INSTALL_DIRS,
    MANIFESTS,
    MONITORING,
    NAMESPACE,
    NATS,
    WORKERS,
    Doc,
    deployment_of,
    find,
    load_docs,
    nats_auth_doc,
)

# Kubernetes YAML under deploy/; the Helm chart's files are templates, checked by tests/deploy/test_helm.py.
ALL_YAML = sorted(
    p
    for p in DEPLOY.rglob("*")
    if p.is_file()
    and (p.suffix in (".yaml", ".yml") or p.name == "Kustomization")
    and p.relative_to(DEPLOY).parts[0] != "helm"
)
INSTALL = INSTALL_DIRS


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, f"{path} holds no document"
    for obj in docs:
        assert isinstance(obj, dict) and obj.get("apiVersion") and obj.get("kind"), (
            f"{path}: not an object: {obj!r:.200}"
        )
        if obj["kind"] != "Kustomization":
            assert obj.get("metadata", {}).get("name"), f"{path}: {obj['kind']} without a name"


# --- schema of built-in kinds --------------------------------------------------------------------

MODEL = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("batch/v1", "Job"): "V1Job",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
}
_LIST, _DICT = re.compile(r"^list\[(.+)\]$"), re.compile(r"^dict\(str, (.+)\)$")
_PRIMITIVE = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (int, float),
    "object": (str, int, dict, list, bool, float),
}


def schema_problems(value: Any, type_name: str, path: str) -> list[str]:
    if m := _LIST.match(type_name):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {value!r:.60}"]
        return [p for i, item in enumerate(value) for p in schema_problems(item, m.group(1), f"{path}[{i}]")]
    if m := _DICT.match(type_name):
        if not isinstance(value, dict):
            return [f"{path}: expected a map, got {value!r:.60}"]
        return [p for k, v in value.items() for p in schema_problems(v, m.group(1), f"{path}.{k}")]
    if type_name in _PRIMITIVE:
        ok = isinstance(value, _PRIMITIVE[type_name]) and not (type_name == "int" and isinstance(value, bool))
        return [] if ok else [f"{path}: expected {type_name}, got {value!r:.60}"]
    if type_name == "datetime":
        return []
    model = getattr(models, type_name)
    if not isinstance(value, dict):
        return [f"{path}: expected an object ({type_name}), got {value!r:.60}"]
    fields = {json_name: model.openapi_types[attr] for attr, json_name in model.attribute_map.items()}
    problems = []
    for key, item in value.items():
        if key not in fields:
            problems.append(f"{path}.{key}: unknown field of {type_name}")
        else:
            problems += schema_problems(item, fields[key], f"{path}.{key}")
    return problems


def _builtin_docs() -> list[Doc]:
    return [d for d in load_docs(*INSTALL, EXAMPLES) if (d.obj["apiVersion"], d.kind) in MODEL]


@pytest.mark.parametrize("doc", _builtin_docs(), ids=repr)
def test_builtin_objects_have_only_known_fields(doc: Doc) -> None:
    assert schema_problems(doc.obj, MODEL[(doc.obj["apiVersion"], doc.kind)], "$") == []


def test_schema_check_catches_a_typo() -> None:
    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "spec": {"template": {"spec": {"containers": [{"name": "x", "readinessProb": {}}]}}},
    }
    assert schema_problems(bad, "V1Deployment", "$") == [
        "$.spec.template.spec.containers[0].readinessProb: unknown field of V1Container"
    ]


def test_only_known_kinds() -> None:
    kinds = {(d.obj["apiVersion"], d.kind) for d in load_docs(*INSTALL)}
    assert kinds <= set(MODEL), kinds - set(MODEL)
    assert {(d.obj["apiVersion"], d.kind) for d in load_docs(MONITORING)} == {
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PodMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
    }


def test_everything_namespaced_lives_in_runnerscale_system() -> None:
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    for doc in load_docs(*INSTALL, MONITORING):
        if doc.kind in cluster_scoped:
            assert not doc.namespace, doc
        else:
            assert doc.namespace == NAMESPACE, doc
    namespaces = [d for d in load_docs(*INSTALL) if d.kind == "Namespace"]
    assert {d.name for d in namespaces} == {NAMESPACE}
    assert len({yaml.safe_dump(d.obj) for d in namespaces}) == 1, (
        "deploy/manifests and deploy/nats must declare the same Namespace"
    )


# --- references between objects ---------------------------------------------------------------------


def _pod_specs(docs: list[Doc]) -> list[tuple[Doc, dict[str, Any]]]:
    return [(d, d.obj["spec"]["template"]["spec"]) for d in docs if d.kind in ("Deployment", "StatefulSet", "Job")]


def test_references_resolve() -> None:
    # The NATS credentials Secret is made at install time (`runnerscale bus secret`), not shipped.
    docs = [*load_docs(*INSTALL), nats_auth_doc()]
    have = {(d.kind, d.name) for d in docs}
    for doc, pod in _pod_specs(docs):
        if "serviceAccountName" in pod:
            assert ("ServiceAccount", pod["serviceAccountName"]) in have, doc
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in have, doc
        for container in pod["containers"]:
            for source in container.get("envFrom", []):
                ref = source.get("configMapRef") or source.get("secretRef")
                kind = "ConfigMap" if "configMapRef" in source else "Secret"
                assert (kind, ref["name"]) in have, f"{doc}: {kind} {ref['name']}"
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    secret = find(docs, "Secret", ref["name"]).obj
                    assert ref["key"] in {**secret.get("data", {}), **secret.get("stringData", {})}, f"{doc}: {ref}"
    for doc in docs:
        if doc.kind in ("RoleBinding", "ClusterRoleBinding"):
            assert (doc.obj["roleRef"]["kind"], doc.obj["roleRef"]["name"]) in have, doc
            if doc.kind == "RoleBinding" and doc.obj["roleRef"]["kind"] == "Role":
                assert find(docs, "Role", doc.obj["roleRef"]["name"]).namespace == doc.namespace
            for subject in doc.obj["subjects"]:
                assert ("ServiceAccount", subject["name"]) in have and subject["namespace"] == NAMESPACE, doc


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_selectors_match() -> None:
    docs = load_docs(*INSTALL)
    workloads = [d for d in docs if d.kind in ("Deployment", "StatefulSet")]
    for doc in workloads:
        assert _matches(
            doc.obj["spec"]["selector"]["matchLabels"], doc.obj["spec"]["template"]["metadata"]["labels"]
        ), doc
    for doc in docs:
        if doc.kind == "Service":
            selected = [
                w
                for w in workloads
                if _matches(doc.obj["spec"]["selector"], w.obj["spec"]["template"]["metadata"]["labels"])
            ]
            assert selected, f"{doc} selects no pods"
            for port in doc.obj["spec"]["ports"]:
                for w in selected:
                    names = {
                        p["name"] for c in w.obj["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
                    }
                    assert port["targetPort"] in names, f"{doc} port {port['name']} → {w}"
        if doc.kind == "PodDisruptionBudget":
            assert any(
                _matches(doc.obj["spec"]["selector"]["matchLabels"], w.obj["spec"]["template"]["metadata"]["labels"])
                for w in workloads
            ), doc
    metrics = find(docs, "Service", "runnerscale-metrics").obj
    selected_names = {
        w.name
        for w in workloads
        if _matches(metrics["spec"]["selector"], w.obj["spec"]["template"]["metadata"]["labels"])
    }
    assert selected_names == {f"runnerscale-{w}" for w in WORKERS}
    monitor = find(load_docs(MONITORING), "ServiceMonitor", "runnerscale-workers").obj
    assert _matches(monitor["spec"]["selector"]["matchLabels"], metrics["metadata"]["labels"])
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in metrics["spec"]["ports"]}


def test_podmonitor_selects_listener_pods() -> None:
    from shared.api.constants import COMPONENT_LISTENER, LABEL_COMPONENT

    monitor = find(load_docs(MONITORING), "PodMonitor", "runnerscale-listeners").obj
    assert monitor["spec"]["selector"]["matchLabels"] == {LABEL_COMPONENT: COMPONENT_LISTENER}
    listener_pod = yaml.safe_load((DEPLOY.parent / "tests" / "data" / "arc" / "listener-pod-desired.yaml").read_text())
    ports = {p["name"] for c in listener_pod["spec"]["containers"] for p in c.get("ports", [])}
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports


# --- worker Deployments ---------------------------------------------------------------------------------


@pytest.mark.parametrize("worker", WORKERS)
def test_worker_deployment_conventions(worker: str) -> None:
    dep = deployment_of(worker)
    spec, pod = dep["spec"], dep["spec"]["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["replicas"] == 2
    assert pod["serviceAccountName"] == f"runnerscale-{worker}"
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert anti["topologyKey"] == "kubernetes.io/hostname" and _matches(anti["labelSelector"]["matchLabels"], labels)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    (container,) = pod["containers"]
    assert container["args"][0] == worker
    sc = container["securityContext"]
    assert (
        sc["readOnlyRootFilesystem"] is True
        and sc["allowPrivilegeEscalation"] is False
        and sc["capabilities"]["drop"] == ["ALL"]
    )
    assert {"cpu", "memory"} <= set(container["resources"]["requests"]) and {"cpu", "memory"} <= set(
        container["resources"]["limits"]
    )

    env = {e["name"]: e for e in container["env"]}
    assert (
        env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    )  # replica id (README "Worker runtime")

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = dict(a.split("=", 1) for a in container["args"][1:] if a.startswith("--") and "=" in a)
    assert args["--metrics-addr"] == f":{ports['metrics']}"
    assert args["--health-addr"] == f":{ports['health']}"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    # graceful stop budget fits in the termination grace period
    config = find(load_docs(MANIFESTS), "ConfigMap", "runnerscale-config").obj["data"]
    assert float(config["RUNNERSCALE_SHUTDOWN_TIMEOUT"]) < pod["terminationGracePeriodSeconds"]
    # /tmp only; the listener-pod worker also reads the listener user's NATS password (test_nats.py)
    extra = {"/etc/runnerscale/nats-listener"} if worker == "listener-pod" else set()
    assert {v["mountPath"] for v in container["volumeMounts"]} == {"/tmp"} | extra


def test_one_image_everywhere() -> None:
    images = {
        c["image"]
        for _, pod in _pod_specs(load_docs(*INSTALL))
        for c in pod["containers"]
        if not c["image"].startswith("nats:")
    }
    config = find(load_docs(MANIFESTS), "ConfigMap", "runnerscale-config").obj["data"]
    assert images == {config["RUNNERSCALE_LISTENER_IMAGE"]}


def test_scale_set_controller_namespace_is_its_own() -> None:
    env = {e["name"]: e for e in deployment_of("scale-set")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RUNNERSCALE_CONTROLLER_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_nats_statefulset_and_job() -> None:
    docs = load_docs(NATS)
    sts = find(docs, "StatefulSet", "nats").obj
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == "nats-headless"
    claim = sts["spec"]["volumeClaimTemplates"][0]
    mounts = {m["name"]: m["mountPath"] for m in sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    conf = find(docs, "ConfigMap", "nats-config").obj["data"]["nats.conf"]
    assert f"store_dir: {mounts[claim['metadata']['name']]}" in conf  # JetStream on the persistent volume
    for i in range(3):
        assert f"nats://nats-{i}.nats-headless.{NAMESPACE}.svc.cluster.local:6222" in conf
    bus = find(docs, "ConfigMap", "runnerscale-bus").obj["data"]
    assert bus["RUNNERSCALE_NATS_URL"] == f"nats://nats.{NAMESPACE}.svc:4222"
    job = find(docs, "Job", "runnerscale-bus-setup").obj["spec"]["template"]["spec"]
    assert job["containers"][0]["args"] == ["bus", "setup"]
    assert job["automountServiceAccountToken"] is False


def test_monitors_keep_the_metrics_namespace_label() -> None:
    """gha_* and gha_controller_* carry `namespace` = the scale set's namespace (ARC); Prometheus
    would rename it to exported_namespace unless the scrape honours the scraped labels."""
    docs = load_docs(MONITORING)
    endpoints = find(docs, "ServiceMonitor", "runnerscale-workers").obj["spec"]["endpoints"]
    endpoints += find(docs, "PodMonitor", "runnerscale-listeners").obj["spec"]["podMetricsEndpoints"]
    assert all(e.get("honorLabels") is True for e in endpoints)
