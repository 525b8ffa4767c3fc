"""deploy/helm/runnerscale, rendered by a real helm (built from the Go module proxy: the first test
of a fresh machine builds it): `helm lint`; `helm template` for the
default values, a maximal values file (every value set) and other installs; the rendered objects
checked — kinds, RBAC equal to deploy/manifests' (which tests/deploy/test_rbac.py checks against the
code), probes, security contexts, every value reaching its object, and each worker's real argument
parser and settings loader accepting its pod's args and environment. Applying them to a Kubernetes
API is tests/deploy/test_helm_apply.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared import crds
from shared.bus import permissions
from tests.deploy.conftest import DEPLOY, MANIFESTS, NATS, ROOT, WORKERS, Doc, find, load_docs
from tests.deploy.helm_chart import CASES, CHART, MAXIMAL, Case, default_values, leaf_paths, render, run_helm, template
from tests.deploy.test_flags import _main, container_env, secret_data
from tests.deploy.test_manifests import MODEL, schema_problems
from tests.deploy.test_nats import mounted_secret_key
from tests.deploy.test_rbac import ANY, CONTROLLER, OPTIONAL, grants
from tests.tools.helm import helm_path, helm_version

# The helm fixture may build helm first (bounded by BUILD_TIMEOUT inside the tool): the usual
# per-test timeout covers the test function only.
pytestmark = pytest.mark.timeout(300, func_only=True)

KEYS = {"scale-set": "scaleSet", "runner-set": "runnerSet", "runner": "runner", "listener-pod": "listenerPod"}


def fullname(case: Case) -> str:
    values = yaml.safe_load(MAXIMAL.read_text()) if MAXIMAL in case.values else {}
    return values.get("fullnameOverride") or (
        case.release if "runnerscale" in case.release else f"{case.release}-runnerscale"
    )


def namespace_of(case: Case) -> str:
    values = yaml.safe_load(MAXIMAL.read_text()) if MAXIMAL in case.values else {}
    return values.get("namespaceOverride") or case.namespace


def account_prefix(case: Case) -> str:
    values = yaml.safe_load(MAXIMAL.read_text()) if MAXIMAL in case.values else {}
    sets = dict(s.split("=", 1) for s in case.sets)
    return values.get("serviceAccount", {}).get("name") or sets.get("serviceAccount.name") or fullname(case)


def deployment(docs: list[Doc], case: Case, worker: str) -> dict[str, Any]:
    return find(docs, "Deployment", f"{fullname(case)}-{worker}").obj


def pod_container(docs: list[Doc], case: Case, worker: str) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = deployment(docs, case, worker)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


# --- the tool ------------------------------------------------------------------------------------------


def test_helm_is_built_from_the_module_proxy_outside_the_checkout(helm: Path) -> None:
    assert helm == helm_path() and ROOT not in helm.parents
    assert helm.parent.name == helm_version()
    result = run_helm(helm, "version", "--template", "{{.Version}} {{.KubeClientVersion}}")
    assert result.returncode == 0, result.stderr
    # the wrapper module lifts client-go to the control plane's v0.37.2
    assert result.stdout.split() == [helm_version(), "v1.37"]


# --- lint ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(CASES.values()), ids=lambda c: c.id)
def test_helm_lint(helm: Path, case: Case) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART), *case.args())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


# --- what is rendered ----------------------------------------------------------------------------------

EXPECTED_KINDS = {
    "default": {
        ("v1", "ConfigMap"): 3,  # config, bus, NATS config
        ("v1", "Secret"): 1,
        ("v1", "Service"): 3,  # metrics, NATS client, NATS headless
        ("v1", "ServiceAccount"): 4,
        ("apps/v1", "Deployment"): 4,
        ("apps/v1", "StatefulSet"): 1,
        ("batch/v1", "Job"): 1,
        ("policy/v1", "PodDisruptionBudget"): 5,
        ("rbac.authorization.k8s.io/v1", "ClusterRole"): 4,
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): 4,
        ("rbac.authorization.k8s.io/v1", "Role"): 4,
        ("rbac.authorization.k8s.io/v1", "RoleBinding"): 4,
    },
    "maximal": {
        ("v1", "ConfigMap"): 3,  # config, bus, dashboard
        ("v1", "Secret"): 1,  # user/password
        ("v1", "Service"): 1,
        ("v1", "ServiceAccount"): 4,
        ("apps/v1", "Deployment"): 4,
        ("batch/v1", "Job"): 1,
        ("policy/v1", "PodDisruptionBudget"): 4,
        ("rbac.authorization.k8s.io/v1", "ClusterRole"): 4,
        # ClusterRoles bound in the three watched namespaces only, plus the controller Role's binding
        ("rbac.authorization.k8s.io/v1", "RoleBinding"): 4 * 3 + 4,
        ("rbac.authorization.k8s.io/v1", "Role"): 4,
        ("monitoring.coreos.com/v1", "ServiceMonitor"): 1,
        ("monitoring.coreos.com/v1", "PodMonitor"): 1,
        ("monitoring.coreos.com/v1", "PrometheusRule"): 1,
    },
    "bundled-custom": {
        ("v1", "ConfigMap"): 3,
        ("v1", "Secret"): 1,
        ("v1", "Service"): 2,  # no metrics Service
        ("v1", "ServiceAccount"): 4,
        ("apps/v1", "Deployment"): 4,
        ("apps/v1", "StatefulSet"): 1,
        ("batch/v1", "Job"): 1,
        ("rbac.authorization.k8s.io/v1", "ClusterRole"): 4,
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): 4,
        ("rbac.authorization.k8s.io/v1", "Role"): 4,
        ("rbac.authorization.k8s.io/v1", "RoleBinding"): 4,
    },
    "external-creds": {
        ("v1", "ConfigMap"): 2,
        ("v1", "Service"): 1,
        ("apps/v1", "Deployment"): 4,
        ("policy/v1", "PodDisruptionBudget"): 4,
        ("rbac.authorization.k8s.io/v1", "ClusterRole"): 4,
        ("rbac.authorization.k8s.io/v1", "Role"): 4,
        ("rbac.authorization.k8s.io/v1", "RoleBinding"): 4 * 2 + 4,
    },
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=lambda c: c.id)
def test_rendered_kinds(helm: Path, case: Case) -> None:
    counts: dict[tuple[str, str], int] = {}
    for doc in render(helm, case):
        key = (doc.obj["apiVersion"], doc.kind)
        counts[key] = counts.get(key, 0) + 1
    assert counts == EXPECTED_KINDS[case.id]


@pytest.mark.parametrize("case", list(CASES.values()), ids=lambda c: c.id)
def test_builtin_objects_have_only_known_fields(helm: Path, case: Case) -> None:
    """Checked against kubernetes-asyncio's models: the kinds the API emulator does not serve
    (Deployments, StatefulSets, Services, ...) are validated here, offline."""
    for doc in render(helm, case):
        if (doc.obj["apiVersion"], doc.kind) in MODEL:
            assert schema_problems(doc.obj, MODEL[(doc.obj["apiVersion"], doc.kind)], "$") == [], doc


@pytest.mark.parametrize("case", list(CASES.values()), ids=lambda c: c.id)
def test_namespaced_objects_live_in_the_controller_namespace(helm: Path, case: Case) -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    watched = _watched(helm, case)
    for doc in render(helm, case):
        if doc.kind in cluster_scoped:
            assert not doc.namespace, doc
        elif doc.kind == "RoleBinding" and doc.name.endswith("-watch"):
            assert doc.namespace in watched, doc
        elif doc.kind == "ConfigMap" and doc.name.endswith("-dashboard"):
            assert doc.namespace == "grafana", doc  # monitoring.dashboard.namespace
        else:
            assert doc.namespace == namespace_of(case), doc


@pytest.mark.parametrize("case", list(CASES.values()), ids=lambda c: c.id)
def test_references_resolve(helm: Path, case: Case) -> None:
    """ServiceAccounts (when the chart creates them), ConfigMaps and Secrets the pods use exist,
    selectors select the pods they are meant for."""
    docs = render(helm, case)
    have = {(d.kind, d.name) for d in docs}
    external = {
        "runnerscale-nats-creds",  # nats.auth.existingSecret
        "nats-ca",  # nats.tls.caSecret
        "extra-ca",  # volumes
    }
    workloads = [d for d in docs if d.kind in ("Deployment", "StatefulSet", "Job")]
    for doc in workloads:
        spec = doc.obj["spec"]
        pod = spec["template"]["spec"]
        if doc.kind != "Job":
            assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items(), doc
        if "serviceAccountName" in pod and "serviceAccount.create=false" not in case.sets:
            assert ("ServiceAccount", pod["serviceAccountName"]) in have, doc
        for volume in pod.get("volumes", []):
            ref = (volume.get("configMap") or {}).get("name") or (volume.get("secret") or {}).get("secretName")
            if ref:
                assert ref in external or ("ConfigMap", ref) in have or ("Secret", ref) in have, (doc, ref)
        for container in pod["containers"]:
            for source in container.get("envFrom", []):
                assert ("ConfigMap", source["configMapRef"]["name"]) in have, doc
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["name"] not in external:
                    assert ref["key"] in secret_data(find(docs, "Secret", ref["name"]).obj), (doc, ref)
    pods = {d.name: d.obj["spec"]["template"]["metadata"]["labels"] for d in workloads}
    for doc in docs:
        selector = doc.obj.get("spec", {}).get("selector")
        if doc.kind == "Service":
            selected = {n for n, labels in pods.items() if selector.items() <= labels.items()}
            assert selected, f"{doc} selects no pods"
            if doc.name.endswith("-metrics"):
                # the workers (and the bus-setup Job's pod, which has no metrics port), not NATS
                jobs = {d.name for d in workloads if d.kind == "Job"}
                assert selected == {f"{fullname(case)}-{w}" for w in WORKERS} | jobs
        if doc.kind == "PodDisruptionBudget":
            assert any(selector["matchLabels"].items() <= labels.items() for labels in pods.values()), doc


# --- the default install is deploy/manifests + deploy/nats --------------------------------------------------

# chart object → plain object, where the names differ (the NATS objects carry the release's name)
PLAIN_NAMES = {
    ("StatefulSet", "runnerscale-nats"): ("StatefulSet", "nats"),
    ("Service", "runnerscale-nats"): ("Service", "nats"),
    ("Service", "runnerscale-nats-headless"): ("Service", "nats-headless"),
    ("ConfigMap", "runnerscale-nats-config"): ("ConfigMap", "nats-config"),
    ("PodDisruptionBudget", "runnerscale-nats"): ("PodDisruptionBudget", "nats"),
}


def test_default_install_has_the_plain_manifests_objects(helm: Path) -> None:
    chart = {PLAIN_NAMES.get((d.kind, d.name), (d.kind, d.name)) for d in render(helm, "default")}
    # the plain manifests' NATS Secret is made at install time (`runnerscale bus secret`)
    plain = {(d.kind, d.name) for d in load_docs(MANIFESTS, NATS)} | {("Secret", "runnerscale-nats-auth")}
    # Helm creates the namespace (`--create-namespace`) and does not own it
    assert chart == plain - {("Namespace", "runnerscale-system")}


@pytest.mark.parametrize("worker", WORKERS)
def test_default_worker_pods_equal_the_plain_manifests(helm: Path, worker: str) -> None:
    """Same args, ports, probes, resources, security contexts, environment, volumes, replicas and
    rollout as deploy/manifests/deployment-<worker>.yaml."""
    chart = deployment(render(helm, "default"), CASES["default"], worker)
    plain = find(load_docs(MANIFESTS), "Deployment", f"runnerscale-{worker}").obj
    assert chart["spec"]["replicas"] == plain["spec"]["replicas"]
    assert chart["spec"]["strategy"] == plain["spec"]["strategy"]
    chart_pod, plain_pod = chart["spec"]["template"]["spec"], plain["spec"]["template"]["spec"]
    for field in ("serviceAccountName", "terminationGracePeriodSeconds", "securityContext", "volumes"):
        assert chart_pod[field] == plain_pod[field], field
    (c,), (p,) = chart_pod["containers"], plain_pod["containers"]
    for field in ("name", "image", "imagePullPolicy", "args", "ports", "resources", "securityContext"):
        assert c[field] == p[field], field
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe] == p[probe], probe
    assert c["volumeMounts"] == p["volumeMounts"]
    assert [e["name"] for e in c["env"]] == [e["name"] for e in p["env"]]
    assert [s["configMapRef"]["name"] for s in c["envFrom"]] == [s["configMapRef"]["name"] for s in p["envFrom"]]
    # anti-affinity and zone spread on the worker's own pods
    selector = chart["spec"]["selector"]["matchLabels"]
    anti = chart_pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector
    assert chart_pod["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"] == selector


def test_default_settings_equal_the_plain_manifests(helm: Path) -> None:
    docs = render(helm, "default")
    config = find(docs, "ConfigMap", "runnerscale-config").obj["data"]
    plain = find(load_docs(MANIFESTS), "ConfigMap", "runnerscale-config").obj["data"]
    assert {k: config[k] for k in plain} == plain
    # the chart also states what the plain install leaves to the workers' defaults
    assert {k: v for k, v in config.items() if k not in plain} == {
        "RUNNERSCALE_LISTENER_LOG_LEVEL": "info",
        "RUNNERSCALE_OWNERSHIP": "kube",
        "RUNNERSCALE_LEASE_DURATION": "20",
    }
    bus = find(docs, "ConfigMap", "runnerscale-bus").obj["data"]
    plain_bus = find(load_docs(NATS), "ConfigMap", "runnerscale-bus").obj["data"]
    assert bus == {**plain_bus, "RUNNERSCALE_NATS_URL": "nats://runnerscale-nats.runnerscale-system.svc:4222"}
    conf = find(docs, "ConfigMap", "runnerscale-nats-config").obj["data"]["nats.conf"]
    plain_conf = find(load_docs(NATS), "ConfigMap", "nats-config").obj["data"]["nats.conf"]
    renamed = plain_conf.replace("nats-", "runnerscale-nats-").replace("name: runnerscale", "name: runnerscale-nats")
    assert conf.strip() == renamed.strip()


def test_default_nats_and_job_equal_the_plain_manifests(helm: Path) -> None:
    docs, plain = render(helm, "default"), load_docs(NATS)
    sts, plain_sts = find(docs, "StatefulSet", "runnerscale-nats").obj, find(plain, "StatefulSet", "nats").obj
    assert sts["spec"]["replicas"] == plain_sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == "runnerscale-nats-headless"
    pod, plain_pod = sts["spec"]["template"]["spec"], plain_sts["spec"]["template"]["spec"]
    for field in ("securityContext", "terminationGracePeriodSeconds", "automountServiceAccountToken"):
        assert pod[field] == plain_pod[field], field
    (c,), (p,) = pod["containers"], plain_pod["containers"]
    for field in ("image", "args", "ports", "startupProbe", "livenessProbe", "readinessProbe", "lifecycle"):
        assert c[field] == p[field], field
    for field in ("resources", "securityContext", "volumeMounts"):
        assert c[field] == p[field], field
    claim, plain_claim = sts["spec"]["volumeClaimTemplates"][0], plain_sts["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"] == plain_claim["spec"]
    job, plain_job = find(docs, "Job", "runnerscale-bus-setup").obj, find(plain, "Job", "runnerscale-bus-setup").obj
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    (jc,), (pc,) = job["spec"]["template"]["spec"]["containers"], plain_job["spec"]["template"]["spec"]["containers"]
    assert jc["args"] == pc["args"] == ["bus", "setup"]
    assert jc["resources"] == pc["resources"]
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


# --- RBAC ---------------------------------------------------------------------------------------------------


def _watched(helm: Path, case: Case) -> list[str]:
    config = next(d for d in render(helm, case) if d.kind == "ConfigMap" and d.name.endswith("-config")).obj["data"]
    return [n for n in config["RUNNERSCALE_WATCH_NAMESPACES"].split(",") if n]


@pytest.mark.parametrize("worker", WORKERS)
@pytest.mark.parametrize("case", list(CASES.values()), ids=lambda c: c.id)
def test_rbac_equals_the_plain_manifests(helm: Path, case: Case, worker: str) -> None:
    """The same (group, resource, verb) grants as deploy/manifests/rbac-<worker>.yaml, to the
    worker's own ServiceAccount. With watched namespaces, the cluster-wide grants are given in those
    namespaces (and the controller namespace) only."""
    # flags.runnerCleanupHookSecrets: the runner gets --cleanup-hook-secrets and the optional grant
    hook_secrets = "--cleanup-hook-secrets" in pod_container(render(helm, case), case, "runner")[1]["args"]
    optional = load_docs(OPTIONAL) if worker == "runner" and hook_secrets else []
    plain = grants(worker, load_docs(MANIFESTS) + optional)
    rendered = grants(
        worker,
        render(helm, case),
        account=f"{account_prefix(case)}-{worker}",
        namespace=namespace_of(case),
    )
    watched = _watched(helm, case)
    if not watched:
        assert dict(rendered) == dict(plain)
        return
    assert namespace_of(case) in watched  # AutoscalingListeners and listener pods live there
    expected = {ns: plain[ANY] for ns in watched if ns != namespace_of(case)}
    expected[CONTROLLER] = plain[CONTROLLER] | plain[ANY]
    assert dict(rendered) == expected


def test_rbac_rules_are_the_same_rules(helm: Path) -> None:
    """Rule by rule (not only the expanded grants): the chart's ClusterRoles and Roles hold the
    plain manifests' rules, so a change on one side is a visible diff on the other."""
    docs = render(helm, "default")

    def expand(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
        return {
            (g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
        }

    for worker in WORKERS:
        for kind in ("ClusterRole", "Role"):
            chart = find(docs, kind, f"runnerscale-{worker}").obj["rules"]
            plain = find(load_docs(MANIFESTS), kind, f"runnerscale-{worker}").obj["rules"]
            assert expand(chart) == expand(plain), (worker, kind)


# --- ARC's gha-runner-scale-set chart finds runnerscale -------------------------------------------------


def arc_chart_lookup(docs: list[Doc], scale_set_namespace: str) -> tuple[str, str]:
    """What ARC's gha-runner-scale-set chart does at install to find the controller's ServiceAccount
    (`lookup` of every Deployment, _helpers.tpl managerServiceAccountName/Namespace): the one
    Deployment labelled app.kubernetes.io/part-of=gha-rs-controller (or the one watching the scale
    set's namespace) names it in two labels. Raises like the chart's `fail`."""
    multi, single = [], {}
    for doc in docs:
        labels = doc.obj["metadata"].get("labels") or {}
        if doc.kind != "Deployment" or labels.get("app.kubernetes.io/part-of") != "gha-rs-controller":
            continue
        if "actions.github.com/controller-watch-single-namespace" in labels:
            single[labels["actions.github.com/controller-watch-single-namespace"]] = labels
        else:
            multi.append(labels)
    if not multi and not single:
        raise LookupError("No gha-rs-controller deployment found")
    if multi and single:
        raise LookupError("Found both gha-rs-controller installed with flags.watchSingleNamespace set and unset")
    if len(multi) > 1:
        raise LookupError("More than one gha-rs-controller deployment found")
    labels = multi[0] if multi else single.get(scale_set_namespace)
    if labels is None:
        raise LookupError("No gha-rs-controller deployment that watch this namespace found")
    return (
        labels["actions.github.com/controller-service-account-namespace"],
        labels["actions.github.com/controller-service-account-name"],
    )


@pytest.mark.parametrize("case", ["default", "maximal"])
def test_arc_scale_set_chart_finds_the_scale_set_worker(helm: Path, case: str) -> None:
    c = CASES[case]
    docs = render(helm, c)
    namespace, account = arc_chart_lookup(docs, "arc-runners")
    assert (namespace, account) == (namespace_of(c), f"{account_prefix(c)}-scale-set")
    assert find(docs, "ServiceAccount", account).namespace == namespace
    # only the scale-set Deployment carries ARC's labels; its pods keep runnerscale's
    dep = deployment(docs, c, "scale-set")
    assert dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/part-of"] == "runnerscale"


def test_without_discovery_arc_chart_needs_the_account_values(helm: Path) -> None:
    with pytest.raises(LookupError, match="No gha-rs-controller deployment found"):
        arc_chart_lookup(render(helm, "external-creds"), "arc-runners")


# --- every value reaches its object ------------------------------------------------------------------------


def test_the_maximal_file_sets_every_value() -> None:
    maximal = yaml.safe_load(MAXIMAL.read_text())
    missing = leaf_paths(default_values()) - leaf_paths(maximal)
    # a map value set to a non-empty map has deeper leaves than the default's empty map
    missing = {p for p in missing if not any(q.startswith(f"{p}.") for q in leaf_paths(maximal))}
    assert not missing, f"values.yaml values not set in {MAXIMAL.name}: {sorted(missing)}"


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_maximal_values_reach_the_objects(helm: Path) -> None:
    case = CASES["maximal"]
    docs = render(helm, case)
    v = yaml.safe_load(MAXIMAL.read_text())
    ns = v["namespaceOverride"]
    for worker in WORKERS:
        values = v["workers"][KEYS[worker]]
        dep = deployment(docs, case, worker)
        pod, c = pod_container(docs, case, worker)
        labels = dep["metadata"]["labels"]
        assert labels["team"] == "platform" and labels["app.kubernetes.io/name"] == "rs"  # labels, nameOverride
        assert dep["spec"]["replicas"] == (values["replicas"] or v["replicaCount"])
        template = dep["spec"]["template"]["metadata"]
        assert template["annotations"]["example.com/scrape"] == "no"
        assert template["labels"]["example.com/pod-label"] == "yes"
        assert c["image"] == "registry.example.com/mirror/runnerscale:0.1.0-custom" and c["imagePullPolicy"] == "Always"
        assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
        assert pod["serviceAccountName"] == f"ci-{worker}"
        assert pod["securityContext"] == v["podSecurityContext"] and c["securityContext"] == v["securityContext"]
        assert c["resources"] == (values["resources"] or v["resources"])
        assert pod["nodeSelector"] == v["nodeSelector"] and pod["tolerations"] == v["tolerations"]
        assert pod["affinity"] == v["affinity"] and pod["topologySpreadConstraints"] == v["topologySpreadConstraints"]
        assert pod["priorityClassName"] == "ci-critical"
        assert pod["terminationGracePeriodSeconds"] == 40
        assert {"name": "extra-ca", "configMap": {"name": "extra-ca"}} in pod["volumes"]
        assert v["volumeMounts"][0] in c["volumeMounts"]
        env = _env(c)
        assert env["EXTRA_FOR_ALL"] == "all"
        for item in values["env"]:
            assert env[item["name"]] == item["value"]
        assert env["RUNNERSCALE_NATS_USER"]["secretKeyRef"] == {"name": "platform-rs-nats-auth", "key": "username"}
        assert env["RUNNERSCALE_NATS_PASSWORD"]["secretKeyRef"] == {"name": "platform-rs-nats-auth", "key": "pass"}
        assert env["RUNNERSCALE_NATS_TLS_CA"] == "/etc/runnerscale/nats-tls/bundle.pem"
        args = c["args"]
        assert args[0] == worker and set(values["extraArgs"]) <= set(args)
        assert "--metrics-addr=:9090" in args and "--health-addr=:9092" in args
        assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9090, "health": 9092}
        assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
        assert c["livenessProbe"]["httpGet"] == c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
        prefixes = [a for a in args if a.startswith("--exclude-label-propagation-prefix=")]
        assert len(prefixes) == (2 if worker != "runner-set" else 0)
    args = pod_container(docs, case, "scale-set")[1]["args"]
    assert "--listener-image-pull-secret=registry-credentials" in args
    assert "--workers=6" in pod_container(docs, case, "runner")[1]["args"]  # flags.runnerMaxConcurrentReconciles
    listener_args = pod_container(docs, case, "listener-pod")[1]["args"]
    assert "--listener-metrics-addr=:9091" in listener_args
    assert "--listener-metrics-endpoint=/custom-metrics" in listener_args

    config = find(docs, "ConfigMap", "platform-rs-config").obj["data"]
    assert config == {
        "RUNNERSCALE_LOG_LEVEL": "warning",  # ARC's "warn"
        "RUNNERSCALE_LISTENER_LOG_LEVEL": "warning",
        "RUNNERSCALE_WORKERS": "8",
        "RUNNERSCALE_KUBE_REQUEST_TIMEOUT": "15",
        "RUNNERSCALE_ACTIONS_TIMEOUT": "45",
        "RUNNERSCALE_SHUTDOWN_TIMEOUT": "25",
        "RUNNERSCALE_WATCH_NAMESPACES": f"arc-runners,arc-runners-2,{ns}",
        "RUNNERSCALE_LISTENER_IMAGE": "registry.example.com/mirror/runnerscale:listener",
        "RUNNERSCALE_OWNERSHIP": "nats",
        "RUNNERSCALE_LEASE_DURATION": "12",
    }
    assert find(docs, "ConfigMap", "platform-rs-bus").obj["data"] == {
        "RUNNERSCALE_NATS_URL": v["nats"]["url"],
        "RUNNERSCALE_NATS_STREAM_REPLICAS": "5",
        "RUNNERSCALE_BUS_LEASE_TTL": "12",
        "RUNNERSCALE_BUS_SHARDS": "32",
        "RUNNERSCALE_NATS_CONNECT_TIMEOUT": "40",
        "RUNNERSCALE_NATS_REQUEST_TIMEOUT": "6",
        "RUNNERSCALE_BUS_PUBLISH_DEADLINE": "35",
        "RUNNERSCALE_NATS_RECONNECT_WAIT": "2",
    }
    secret = find(docs, "Secret", "platform-rs-nats-auth").obj
    assert secret_data(secret) == {"username": "runnerscale", "pass": "s3cret-password"}
    accounts = [d for d in docs if d.kind == "ServiceAccount"]
    assert {d.name for d in accounts} == {f"ci-{w}" for w in WORKERS}
    assert all(d.obj["metadata"]["annotations"] == v["serviceAccount"]["annotations"] for d in accounts)
    scale_set_labels = deployment(docs, case, "scale-set")["metadata"]["labels"]
    assert scale_set_labels["actions.github.com/controller-watch-single-namespace"] == "arc-runners"

    job = find(docs, "Job", "platform-rs-bus-setup").obj
    assert job["spec"]["backoffLimit"] == 7
    (jc,) = job["spec"]["template"]["spec"]["containers"]
    assert jc["resources"] == v["bus"]["setupJob"]["resources"]
    assert _env(jc)["RUNNERSCALE_NATS_TLS_CA"] == "/etc/runnerscale/nats-tls/bundle.pem"
    for pdb in (d for d in docs if d.kind == "PodDisruptionBudget"):
        assert pdb.obj["spec"]["maxUnavailable"] == 2

    monitor = find(docs, "ServiceMonitor", "platform-rs-workers").obj
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"][0]["interval"] == "15s"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [ns]}
    podmon = find(docs, "PodMonitor", "platform-rs-listeners").obj
    assert podmon["spec"]["podMetricsEndpoints"][0] == {
        "port": "metrics",
        "path": "/custom-metrics",
        "interval": "20s",
        "honorLabels": True,
    }
    rule = find(docs, "PrometheusRule", "platform-rs").obj
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    plain_rule = find(load_docs(MANIFESTS / "monitoring"), "PrometheusRule", "runnerscale").obj
    assert rule["spec"] == plain_rule["spec"]  # alerts' {{ $labels }} templates survive Helm
    dashboard = find(docs, "ConfigMap", "platform-rs-dashboard").obj
    assert dashboard["metadata"]["labels"]["example.com/folder"] == "ci"
    assert dashboard["data"]["runnerscale.json"] == (DEPLOY / "dashboards" / "runnerscale.json").read_text().rstrip(
        "\n"
    )


def test_bundled_nats_values_reach_the_statefulset(helm: Path) -> None:
    case = CASES["bundled-custom"]
    docs = render(helm, case)
    sts = find(docs, "StatefulSet", "ci-runnerscale-nats").obj
    assert sts["spec"]["replicas"] == 5
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "fast"
    conf = find(docs, "ConfigMap", "ci-runnerscale-nats-config").obj["data"]["nats.conf"]
    routes = re.findall(r"nats://(\S+):6222", conf)
    assert routes == [
        f"ci-runnerscale-nats-{i}.ci-runnerscale-nats-headless.ci-runners.svc.cluster.local" for i in range(5)
    ]
    token = secret_data(find(docs, "Secret", "ci-runnerscale-nats-auth").obj)["token"]
    assert token == "a-token-from-values"
    # metrics=null: no metrics port, no metrics Service, the workers serve none
    for worker in WORKERS:
        _, c = pod_container(docs, case, worker)
        assert "--metrics-addr=0" in c["args"] and [p["name"] for p in c["ports"]] == ["health"]
    assert "--listener-metrics-addr=0" in pod_container(docs, case, "listener-pod")[1]["args"]


def test_generated_passwords_are_shared_by_nats_and_the_workers(helm: Path) -> None:
    """Method users (the default): a random password per component in one Secret, each worker and
    the setup Job connect as their own user, the servers read every password from it."""
    docs = render(helm, "default")
    passwords = secret_data(find(docs, "Secret", "runnerscale-nats-auth").obj)
    assert set(passwords) == set(permissions.COMPONENTS)
    assert all(re.fullmatch(r"[A-Za-z0-9]{32}", pw) for pw in passwords.values())
    assert len(set(passwords.values())) == len(passwords)
    nats_env = _env(find(docs, "StatefulSet", "runnerscale-nats").obj["spec"]["template"]["spec"]["containers"][0])
    for component in permissions.COMPONENTS:
        assert nats_env[permissions.password_env_var(component)]["secretKeyRef"] == {
            "name": "runnerscale-nats-auth",
            "key": component,
        }
    assert "NATS_TOKEN" not in nats_env
    for worker in WORKERS:
        env = _env(pod_container(docs, CASES["default"], worker)[1])
        assert env["RUNNERSCALE_NATS_USER"] == worker
        assert env["RUNNERSCALE_NATS_PASSWORD"]["secretKeyRef"] == {"name": "runnerscale-nats-auth", "key": worker}
    job_env = _env(find(docs, "Job", "runnerscale-bus-setup").obj["spec"]["template"]["spec"]["containers"][0])
    assert job_env["RUNNERSCALE_NATS_USER"] == "bus-setup"


@pytest.mark.parametrize("case", ["default", "bundled-custom"])
def test_listener_pods_get_the_listener_user_from_the_chart_secret(helm: Path, case: str) -> None:
    """Method users: the listener-pod worker reads the listener user's password from the Secret key
    ``listener`` mounted as a file and writes it into each listener's config; the other methods
    have no per-component users, so nothing is mounted and listener pods get the worker's own."""
    docs = render(helm, case)
    pod, container = pod_container(docs, CASES[case], "listener-pod")
    env = _env(container)
    if case != "default":
        assert "RUNNERSCALE_LISTENER_NATS_USER" not in env
        assert not any(v["name"] == "nats-listener" for v in pod["volumes"])
        return
    assert env["RUNNERSCALE_LISTENER_NATS_USER"] == "listener"
    path = env["RUNNERSCALE_LISTENER_NATS_PASSWORD_FILE"]
    assert mounted_secret_key(pod, container, path) == ("runnerscale-nats-auth", "listener")
    for worker in set(WORKERS) - {"listener-pod"}:
        other_pod, other = pod_container(docs, CASES[case], worker)
        assert "RUNNERSCALE_LISTENER_NATS_USER" not in _env(other)
        assert not any(v["name"] == "nats-listener" for v in other_pod["volumes"])


def test_chart_authorization_is_the_permissions_table() -> None:
    refs = {c: f"${permissions.password_env_var(c)}" for c in permissions.COMPONENTS}
    assert (CHART / "files" / "nats-authorization.conf").read_text() == permissions.render_authorization(refs)


def test_external_creds_are_mounted(helm: Path) -> None:
    case = CASES["external-creds"]
    docs = render(helm, case)
    assert not [d for d in docs if d.kind in ("Secret", "StatefulSet", "ServiceAccount", "Job")]
    for worker in WORKERS:
        pod, c = pod_container(docs, case, worker)
        assert _env(c)["RUNNERSCALE_NATS_CREDS"] == "/etc/runnerscale/nats-auth/nats.creds"
        assert {"name": "nats-auth", "mountPath": "/etc/runnerscale/nats-auth", "readOnly": True} in c["volumeMounts"]
        volume = next(v for v in pod["volumes"] if v["name"] == "nats-auth")
        assert volume["secret"] == {
            "secretName": "runnerscale-nats-creds",
            "items": [{"key": "nats.creds", "path": "nats.creds"}],
        }
        assert pod["serviceAccountName"] == f"platform-{worker}"
    labels = deployment(docs, case, "scale-set")["metadata"]["labels"]
    assert labels["app.kubernetes.io/part-of"] == "runnerscale"


# --- bad values get a clear error ----------------------------------------------------------------------------

BAD_VALUES = [
    (("flags.logFormat=text",), 'flags.logFormat "text" is not supported'),
    (("flags.logLevel=verbose",), 'flags.logLevel "verbose"'),
    (("flags.healthProbeBindAddress=",), "flags.healthProbeBindAddress must end with a numeric port"),
    (("metrics.controllerManagerAddr=:8081",), "must use different ports"),
    (("config.shutdownTimeout=30",), "config.shutdownTimeout must be below terminationGracePeriodSeconds"),
    (("nats.url=nats://elsewhere:4222",), "set nats.bundled=false"),
    (("nats.auth.method=creds",), "nats.auth.method must be users or token"),
    (("bus.streamReplicas=5",), "bus.streamReplicas (5) cannot exceed nats.replicas (3)"),
    (("nats.bundled=false",), "nats.url is required when nats.bundled is false"),
    (
        ("nats.bundled=false", "nats.url=nats://n:4222"),
        "users on an existing NATS cluster needs nats.auth.existingSecret",
    ),
    (
        ("nats.bundled=false", "nats.url=nats://n:4222", "nats.auth.method=token"),
        "an existing NATS cluster needs its token",
    ),
    (("nats.bundled=false", "nats.url=nats://n:4222", "nats.auth.method=creds"), "needs nats.auth.existingSecret"),
    (("serviceAccount.create=false",), "serviceAccount.name is required"),
    (("serviceAccount.name=default",), 'must not be "default"'),
    # the schema: unknown keys (e.g. ARC values runnerscale cannot honour) and wrong types
    (("flags.k8sClientRateLimiterQPS=20",), "k8sClientRateLimiterQPS"),
    (("pprof.addr=:6060",), "pprof"),
    (("replicaCount=two",), "replicaCount"),
    (("sharding.ownership=etcd",), "ownership"),
    (("nats.auth.method=mtls",), "method"),
]


@pytest.mark.parametrize(("sets", "message"), BAD_VALUES, ids=[s[0][0] for s in BAD_VALUES])
def test_bad_values_fail_with_a_message(helm: Path, sets: tuple[str, ...], message: str) -> None:
    result = template(helm, Case("bad", sets=sets))
    assert result.returncode != 0, f"{sets} rendered"
    assert message in result.stderr, result.stderr


# --- the workers accept what the chart gives them ---------------------------------------------------------


def _materialise_mounts(pod: dict[str, Any], container: dict[str, Any], tmp_path: Path) -> dict[str, str]:
    """The files a pod sees under its Secret mounts, written to tmp_path: mount path → local path."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    out = {}
    for mount in container.get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is None:
            continue
        local = tmp_path / mount["name"]
        local.mkdir()
        for item in secret.get("items", []):
            (local / item["path"]).write_text("-----BEGIN CERTIFICATE-----\nplaceholder\n-----END CERTIFICATE-----\n")
        out[mount["mountPath"]] = str(local)
    return out


@pytest.mark.parametrize("worker", WORKERS)
@pytest.mark.parametrize("case", ["default", "maximal", "bundled-custom"])
def test_workers_accept_the_rendered_pods(
    helm: Path,
    case: str,
    worker: str,
    captured: list[tuple[Any, ...]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each worker's real main() with its rendered args and the environment Kubernetes would build
    (only anyio.run is replaced): the chart's flags and settings exist and are valid, and end up
    as the values say."""
    c = CASES[case]
    docs = render(helm, c)
    pod, container = pod_container(docs, c, worker)
    pod_name = f"{fullname(c)}-{worker}-7d9f8c6b5-x2k4q"
    mounts = _materialise_mounts(pod, container, tmp_path)
    for name, value in container_env(container, pod_name, docs, namespace_of(c)).items():
        seen = value
        for mount, local in mounts.items():
            seen = seen.replace(mount, local)
        monkeypatch.setenv(name, seen)
    subcommand, *argv = container["args"]
    assert subcommand == worker

    assert _main(worker)(argv) == 0, capsys.readouterr().err

    ((_run, name, settings, _setup),) = captured
    assert name == worker and settings.replica_id == pod_name
    bus = next(d for d in docs if d.kind == "ConfigMap" and d.name.endswith("-bus")).obj["data"]
    assert list(settings.bus.nats_urls) == bus["RUNNERSCALE_NATS_URL"].split(",")
    assert settings.bus.shards == int(bus["RUNNERSCALE_BUS_SHARDS"])
    # the shard Leases go to the pod's own namespace
    from shared.kube.leases import default_lease_namespace

    assert (settings.lease_namespace or default_lease_namespace()) == namespace_of(c)
    if case == "maximal":
        assert settings.namespaces == ("arc-runners", "arc-runners-2", "ci-system")
        assert settings.log_level == "warning"
        assert settings.workers == (6 if worker == "runner" else 8)  # flags.runnerMaxConcurrentReconciles
        assert settings.metrics_addr == ":9090" and settings.health_addr == ":9092"
        assert settings.bus.user == "runnerscale" and settings.bus.password == "s3cret-password"
        assert settings.bus.tls_ca.endswith("bundle.pem") and settings.ownership == "nats"
        assert settings.bus.lease_ttl == 12 and settings.lease_duration == 12
    elif case == "default":
        assert settings.namespaces == () and settings.bus.user == worker and settings.bus.password
    else:
        assert settings.namespaces == () and settings.bus.token


def test_bus_setup_job_accepts_its_settings(
    helm: Path, captured: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from shared.bus.cli import main as bus_main

    docs = render(helm, "default")
    job = find(docs, "Job", "runnerscale-bus-setup").obj
    (container,) = job["spec"]["template"]["spec"]["containers"]
    for name, value in container_env(container, "runnerscale-bus-setup-abcde", docs).items():
        monkeypatch.setenv(name, value)
    assert bus_main(container["args"][1:]) == 0
    ((_setup, settings),) = captured
    assert settings.stream_replicas == 3 and settings.user == "bus-setup" and settings.password


# --- chart files generated elsewhere ----------------------------------------------------------------------


def test_chart_crds_are_the_generated_ones() -> None:
    expected = crds.rendered_files()
    chart = {p.name: p.read_text() for p in sorted((CHART / "crds").glob("*.yaml"))}
    plain = {p.name: p.read_text() for p in sorted((DEPLOY / "crds").glob("*.yaml"))}
    assert chart == expected == plain, "run: python -m shared.crds --write --dir deploy/helm/runnerscale/crds"


def test_chart_version_is_the_project_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert project is not None
    assert chart["version"] == chart["appVersion"] == project.group(1)


def test_values_schema_knows_every_value() -> None:
    """values.schema.json describes each value of values.yaml (and refuses others)."""
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())

    def paths(node: dict[str, Any], prefix: str = "") -> set[str]:
        props = node.get("properties")
        if not props:
            return {prefix.rstrip(".")}
        assert node.get("additionalProperties") is False, f"{prefix or 'root'} must refuse unknown keys"
        return set().union(*(paths(sub, f"{prefix}{key}.") for key, sub in props.items()))

    documented = paths(schema)
    for path in leaf_paths(default_values()):
        assert path in documented or any(path.startswith(f"{d}.") for d in documented), path


def test_readme_documents_every_value() -> None:
    """Each value of values.yaml (or the map it belongs to) has a row in the README's Helm values
    tables; the tables name no value the chart does not have."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("#### Helm values") : readme.index("### 4. Configuration")]
    documented = set()
    for row in re.findall(r"^\| (`[^|]+)\|", section, re.MULTILINE):
        documented |= set(re.findall(r"`([A-Za-z][\w.<>]*)`", row))
    values = {re.sub(r"^workers\.\w+\.", "workers.<worker>.", p) for p in leaf_paths(default_values())}
    undocumented = {p for p in values if not any(p == d or p.startswith(f"{d}.") for d in documented)}
    assert not undocumented, f"values without a README row: {sorted(undocumented)}"
    unknown = {d for d in documented if not any(p == d or p.startswith(f"{d}.") for p in values)}
    assert not unknown, f"README rows for values the chart does not have: {sorted(unknown)}"


@pytest.mark.parametrize("case", ["default", "bundled-custom"])
def test_bundled_nats_config_is_valid_for_nats_server(helm: Path, case: str, tmp_path: Path) -> None:
    """Users (default) or token (bundled-custom): the rendered nats.conf is accepted by nats-server."""
    import os
    import subprocess

    from tests.fixtures.nats import nats_server_binary

    docs = render(helm, case)
    conf = next(d for d in docs if d.kind == "ConfigMap" and d.name.endswith("-nats-config")).obj["data"]["nats.conf"]
    path = tmp_path / "nats.conf"
    path.write_text(conf)
    env = {"PATH": os.environ.get("PATH", ""), "POD_NAME": "nats-0", "NATS_TOKEN": "t"}
    env |= {permissions.password_env_var(c): f"pw-{c}" for c in permissions.COMPONENTS}
    done = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(path)], capture_output=True, text=True, env=env, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert ('user: "runner-set"' in conf) == (case == "default")
