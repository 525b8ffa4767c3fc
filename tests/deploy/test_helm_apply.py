"""The chart's rendered manifests applied to a Kubernetes API: the ``kube_api`` fixture, i.e. the API
emulator, or the real control plane when the suite runs against one (RUNNERSCALE_KUBECONFIG).

On the emulator, `kubectl apply` stores every object of a kind it serves (ConfigMaps, Secrets,
ServiceAccounts, Roles, RoleBindings; CRDs with a server-side dry run, since the session's emulator
already holds them) and refuses the rest *only* because the kind is not served: each refusal must be
kubectl's "no matches for kind" for a kind missing from discovery. Those kinds (Deployments,
StatefulSets, Services, Jobs, PodDisruptionBudgets, ClusterRoles, ClusterRoleBindings) are checked
offline against kubernetes-asyncio's models by test_helm.py; the emulator is not made to serve them
because runnerscale never reads or writes them. A real control plane validates everything: server-
side apply with `--dry-run=server` (strict field validation, defaulting and admission, nothing
stored) of the whole release.

ARC's gha-runner-scale-set chart output (tests/deploy/data/arc-gha-runner-scale-set-0.14.2.yaml)
then applies unchanged next to it, and its AutoscalingRunnerSet reads back as written and passes the
scale-set worker's validation."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.api import AutoscalingRunnerSet, decode, validate
from tests.deploy.conftest import KUBECTL, Doc, kubectl
from tests.deploy.helm_chart import DATA, MAXIMAL, Case, render
from tests.deploy.test_helm import arc_chart_lookup

pytestmark = [
    pytest.mark.kubectl,
    # the helm fixture may build helm first (bounded inside the tool): time the test function only
    pytest.mark.timeout(300, func_only=True),
]

ARC_CHART_OUTPUT = DATA / "arc-gha-runner-scale-set-0.14.2.yaml"
_NO_MATCH = re.compile(r'no matches for kind "(\w+)" in version "([\w./]+)"')


@pytest.fixture(autouse=True)
def _needs_kubectl() -> None:
    import os

    if not os.access(KUBECTL, os.X_OK):
        pytest.fail(f"kubectl is needed at {KUBECTL} (apt-get install kubectl, or the Kubernetes release binaries)")


def _case(variant: str, namespace: str) -> Case:
    """The chart installed into the test's namespace, with a release name of its own (cluster-scoped
    names such as ClusterRoles stay unique on a shared cluster)."""
    if variant == "default":
        return Case(
            f"apply-{namespace}", release=f"rs-{namespace}", namespace=namespace, sets=("nats.auth.token=t0k3n",)
        )
    # every value set, everything in the test namespace (the watched namespace included)
    return Case(
        f"apply-max-{namespace}",
        release=f"rs-{namespace}",
        namespace=namespace,
        values=(MAXIMAL,),
        sets=(
            f"namespaceOverride={namespace}",
            f"flags.watchSingleNamespace={namespace}",
            "flags.watchNamespaces=null",
            f"monitoring.dashboard.namespace={namespace}",
        ),
    )


def _write(path: Path, docs: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def served_kinds(kubeconfig: Path, docs: list[Doc]) -> set[tuple[str, str]]:
    """(apiVersion, kind) of ``docs`` that the server's discovery lists."""
    served = set()
    for api_version in sorted({d.obj["apiVersion"] for d in docs}):
        path = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        got = kubectl("get", "--raw", path, kubeconfig=kubeconfig)
        if got.returncode != 0:
            continue  # the group/version is not served at all
        kinds = {r["kind"] for r in json.loads(got.stdout)["resources"] if "/" not in r["name"]}
        served |= {(api_version, d.kind) for d in docs if d.obj["apiVersion"] == api_version and d.kind in kinds}
    return served


def _stored(kubeconfig: Path, doc: dict[str, Any]) -> dict[str, Any]:
    group = doc["apiVersion"].rpartition("/")[0]
    resource = doc["kind"].lower() + (f".{group}" if group else "")
    args = ["get", resource, doc["metadata"]["name"], "-o", "json"]
    if doc["metadata"].get("namespace"):
        args += ["-n", doc["metadata"]["namespace"]]
    got = kubectl(*args, kubeconfig=kubeconfig)
    assert got.returncode == 0, got.stderr
    obj: dict[str, Any] = json.loads(got.stdout)
    return obj


@pytest.mark.parametrize("variant", ["default", "maximal"])
def test_chart_applies(helm: Path, kube_api: Any, namespace: str, tmp_path: Path, variant: str) -> None:
    docs = render(helm, _case(variant, namespace), include_crds=True)
    crds = [d.obj for d in docs if d.kind == "CustomResourceDefinition"]
    objects = [d for d in docs if d.kind != "CustomResourceDefinition"]
    assert len(crds) == 4 and {d.namespace for d in objects if d.namespace} == {namespace}

    # The CRDs: validated by the server, not changed (the session's CRDs are the same files). The
    # emulator does not emulate server-side apply (README "Known deviations"): a client-side apply
    # with a server dry run there.
    crd_file = _write(tmp_path / "crds.yaml", crds)
    if kube_api.is_emulator:
        result = kubectl("apply", "--dry-run=server", "-f", str(crd_file), kubeconfig=kube_api.kubeconfig)
    else:
        result = kubectl(
            "apply", "--server-side", "--dry-run=server", "--field-manager=runnerscale-chart-test",
            "--force-conflicts", "-f", str(crd_file), kubeconfig=kube_api.kubeconfig,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 4, result.stdout

    manifest = _write(tmp_path / "release.yaml", [d.obj for d in objects])
    if not kube_api.is_emulator:
        # Everything but the Prometheus operator's kinds, which a cluster without the operator lacks.
        served = served_kinds(kube_api.kubeconfig, objects)
        unserved = {(d.obj["apiVersion"], d.kind) for d in objects} - served
        assert {v for v, _ in unserved} <= {"monitoring.coreos.com/v1"}, unserved
        served_docs = [d for d in objects if (d.obj["apiVersion"], d.kind) in served]
        result = kubectl(
            "apply", "--server-side", "--dry-run=server", "--field-manager=runnerscale-chart-test",
            "-f", str(_write(tmp_path / "served.yaml", [d.obj for d in served_docs])),
            kubeconfig=kube_api.kubeconfig, timeout=120,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "warning" not in result.stderr.lower(), result.stderr
        applied = [line for line in result.stdout.splitlines() if line.endswith("(server dry run)")]
        assert len(applied) == len(served_docs), result.stdout
        return

    served = served_kinds(kube_api.kubeconfig, objects)
    unserved = {(d.obj["apiVersion"], d.kind) for d in objects} - served
    # what the emulator serves is what runnerscale uses; the workloads are not among them
    assert ("apps/v1", "Deployment") in unserved and ("v1", "Secret") in served
    # 1. the whole release: kubectl refuses exactly the kinds the server does not serve, and nothing else
    # (no validation here: kubectl's schema check would stop at the first unserved kind)
    result = kubectl(
        "apply", "--dry-run=client", "--validate=false", "-f", str(manifest), kubeconfig=kube_api.kubeconfig
    )  # fmt: skip
    refused = {(v, k) for k, v in _NO_MATCH.findall(result.stderr)}
    other_errors = [
        line
        for line in result.stderr.splitlines()
        if line.strip() and not _NO_MATCH.search(line) and "ensure CRDs are installed first" not in line
    ]
    assert other_errors == [], result.stderr
    assert refused == unserved, f"refused {refused}, not served {unserved}"
    # 2. what it serves, for real, with strict server-side field validation
    served_docs = [d for d in objects if (d.obj["apiVersion"], d.kind) in served]
    result = kubectl(
        "apply", "--validate=strict", "-f", str(_write(tmp_path / "served.yaml", [d.obj for d in served_docs])),
        kubeconfig=kube_api.kubeconfig, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    created = {line.split()[0] for line in result.stdout.splitlines() if line.endswith(" created")}
    expected = {
        f"{d.kind.lower()}{'.' + d.obj['apiVersion'].rpartition('/')[0] if '/' in d.obj['apiVersion'] else ''}/{d.name}"
        for d in served_docs
    }
    assert created == expected, result.stdout
    for doc in objects:
        if (doc.obj["apiVersion"], doc.kind) not in served:
            continue
        stored = _stored(kube_api.kubeconfig, doc.obj)
        for field, value in doc.obj.items():
            if field not in ("apiVersion", "kind", "metadata"):
                assert stored[field] == value, f"{doc}: {field} changed by the server"
        assert doc.obj["metadata"]["labels"].items() <= stored["metadata"]["labels"].items(), doc


@pytest.fixture
def crds_installed(helm: Path, kube_api: Any, tmp_path: Path) -> Iterator[None]:
    """The chart's CRDs on the server: the emulator loads them at start; on a real cluster that lacks
    them they are installed (server-side apply, as Helm does) and removed again afterwards."""
    present = kubectl("get", "crd", "autoscalingrunnersets.actions.github.com", kubeconfig=kube_api.kubeconfig)
    if present.returncode == 0:
        yield
        return
    assert not kube_api.is_emulator, present.stderr
    crds = [d.obj for d in render(helm, "default", include_crds=True) if d.kind == "CustomResourceDefinition"]
    path = _write(tmp_path / "crds.yaml", crds)
    result = kubectl("apply", "--server-side", "-f", str(path), kubeconfig=kube_api.kubeconfig)
    assert result.returncode == 0, result.stderr
    waited = kubectl(
        "wait", "--for=condition=Established", "-f", str(path), "--timeout=60s", kubeconfig=kube_api.kubeconfig, timeout=90
    )  # fmt: skip
    assert waited.returncode == 0, waited.stderr
    try:
        yield
    finally:
        kubectl("delete", "-f", str(path), "--wait=false", kubeconfig=kube_api.kubeconfig)


@pytest.fixture
def arc_chart_objects(
    helm: Path, kube_api: Any, namespace: str, crds_installed: None
) -> Iterator[list[dict[str, Any]]]:
    """ARC's chart output for a scale set in ``namespace``, its RoleBinding subject filled by ARC's
    lookup against runnerscale's rendered release; the cleanup-protection finalizers (which
    runnerscale's scale-set worker would remove on deletion) are stripped after the test."""
    controller_ns, account = arc_chart_lookup(render(helm, Case("arc-lookup")), namespace)
    objects = [obj for obj in yaml.safe_load_all(ARC_CHART_OUTPUT.read_text()) if obj]
    for obj in objects:
        obj["metadata"]["namespace"] = namespace
        obj["metadata"]["labels"]["actions.github.com/scale-set-namespace"] = namespace
        for subject in obj.get("subjects", []):
            subject.update(name=account, namespace=controller_ns)
    try:
        yield objects
    finally:
        for obj in objects:
            if obj["metadata"].get("finalizers"):
                kubectl(
                    "patch", obj["kind"].lower() + ("." + obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""),
                    obj["metadata"]["name"], "-n", namespace, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                    kubeconfig=kube_api.kubeconfig,
                )  # fmt: skip


def test_arc_scale_set_chart_output_applies_unchanged(
    arc_chart_objects: list[dict[str, Any]], kube_api: Any, namespace: str, tmp_path: Path
) -> None:
    result = kubectl(
        "apply", "-f", str(_write(tmp_path / "arc.yaml", arc_chart_objects)), kubeconfig=kube_api.kubeconfig
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr  # no field pruned or unknown
    assert len([line for line in result.stdout.splitlines() if line.endswith(" created")]) == len(arc_chart_objects)

    (ars_doc,) = [o for o in arc_chart_objects if o["kind"] == "AutoscalingRunnerSet"]
    stored = _stored(kube_api.kubeconfig, ars_doc)
    assert stored["spec"] == ars_doc["spec"], "the server changed the spec"
    assert ars_doc["metadata"]["labels"].items() <= stored["metadata"]["labels"].items()
    assert ars_doc["metadata"]["annotations"].items() <= stored["metadata"]["annotations"].items()
    ars = decode(AutoscalingRunnerSet, stored)
    assert validate(ars) == []
    assert ars.spec.github_config_secret == "arc-runner-set-gha-rs-github-secret"
    secret = _stored(kube_api.kubeconfig, arc_chart_objects[0])
    assert set(secret["data"]) == {"github_token"}
    assert secret["metadata"]["finalizers"] == ["actions.github.com/cleanup-protection"]
    binding = next(o for o in arc_chart_objects if o["kind"] == "RoleBinding")
    assert _stored(kube_api.kubeconfig, binding)["subjects"] == binding["subjects"]


def test_arc_chart_fixture_is_what_the_chart_renders() -> None:
    """The fixture keeps the chart's shape: one object of each kind the chart renders for a
    token secret in the default container mode, all but the ARS with the cleanup-protection
    finalizer, named as the ARS's cleanup annotations say."""
    objects = {o["kind"]: o for o in yaml.safe_load_all(ARC_CHART_OUTPUT.read_text()) if o}
    assert set(objects) == {"Secret", "ServiceAccount", "Role", "RoleBinding", "AutoscalingRunnerSet"}
    ars = objects.pop("AutoscalingRunnerSet")
    annotations = ars["metadata"]["annotations"]
    assert annotations["actions.github.com/cleanup-github-secret-name"] == objects["Secret"]["metadata"]["name"]
    assert annotations["actions.github.com/cleanup-manager-role-name"] == objects["Role"]["metadata"]["name"]
    assert annotations["actions.github.com/cleanup-manager-role-binding"] == objects["RoleBinding"]["metadata"]["name"]
    assert (
        annotations["actions.github.com/cleanup-no-permission-service-account-name"]
        == objects["ServiceAccount"]["metadata"]["name"]
        == ars["spec"]["template"]["spec"]["serviceAccountName"]
    )
    for obj in objects.values():
        assert obj["metadata"]["finalizers"] == ["actions.github.com/cleanup-protection"]
        assert obj["metadata"]["annotations"] is None  # an empty `annotations:` as the chart renders it


def _server_rules(kubeconfig: Path, tmp_path: Path, account: str, namespace: str) -> set[tuple[str, str, str]]:
    """What the API server's authorizer lets ``account`` do in ``namespace`` (a SelfSubjectRulesReview
    made as that account), expanded to (group, resource, verb)."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace},
    }
    path = _write(tmp_path / "review.yaml", [review])
    # --validate=false: kubectl's schema check would list CRDs, which the account may not do
    got = kubectl("create", "--validate=false", f"--as={account}", "-o", "json", "-f", str(path), kubeconfig=kubeconfig)
    assert got.returncode == 0, got.stderr
    status = json.loads(got.stdout)["status"]
    assert not status.get("incomplete"), status
    return {
        (g, r, v)
        for rule in status["resourceRules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
        if not rule.get("resourceNames")
    }


def test_rbac_is_enforced_as_intended_by_a_real_api_server(
    helm: Path, kube_api: Any, namespace: str, crds_installed: None, tmp_path: Path
) -> None:
    """The chart's ServiceAccounts, ClusterRoles and Roles installed for real; the API server's RBAC
    authorizer then grants each worker exactly the uses tests/deploy/test_rbac.py lists for it: in
    the controller namespace all of them, in a scale sets' namespace the cluster-wide ones only
    (beyond what every authenticated account may do); and the listener-pod worker may create its
    listener Role (no escalation refusal)."""
    if kube_api.is_emulator:
        pytest.skip("RBAC enforcement needs a real API server: the emulator stores RBAC objects but authorizes all")
    from services.listener_pod.build import role_rules
    from tests.deploy.test_rbac import ANY, USES

    case = _case("default", namespace)
    kinds = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    rbac = [d.obj for d in render(helm, case) if d.kind in kinds]
    result = kubectl(
        "apply", "--server-side", "-f", str(_write(tmp_path / "rbac.yaml", rbac)), kubeconfig=kube_api.kubeconfig
    )
    try:
        assert result.returncode == 0, result.stderr
        elsewhere = f"{namespace}-elsewhere"  # a scale sets' namespace (a rules review needs no namespace object)
        nobody = f"system:serviceaccount:{namespace}:nobody"  # what any account may do (discovery, self reviews)
        baseline = {ns: _server_rules(kube_api.kubeconfig, tmp_path, nobody, ns) for ns in (namespace, elsewhere)}
        for worker, uses in USES.items():
            account = f"system:serviceaccount:{namespace}:rs-{namespace}-runnerscale-{worker}"
            in_controller = _server_rules(kube_api.kubeconfig, tmp_path, account, namespace) - baseline[namespace]
            in_scale_sets = _server_rules(kube_api.kubeconfig, tmp_path, account, elsewhere) - baseline[elsewhere]
            assert in_controller == {(g, r, v) for g, r, v, _ in uses}, worker
            assert in_scale_sets == {(g, r, v) for g, r, v, scope in uses if scope == ANY}, worker

        listener_role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "arc-runner-set-listener", "namespace": namespace},
            "rules": role_rules("arc-runner-set-abc12"),
        }
        created = kubectl(
            "create", "--dry-run=server", "--validate=false", "-f", str(_write(tmp_path / "role.yaml", [listener_role])),
            f"--as=system:serviceaccount:{namespace}:rs-{namespace}-runnerscale-listener-pod",
            kubeconfig=kube_api.kubeconfig,
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
    finally:
        cluster_scoped = [o for o in rbac if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
        kubectl(
            "delete", "--ignore-not-found", "-f", str(_write(tmp_path / "cluster.yaml", cluster_scoped)),
            kubeconfig=kube_api.kubeconfig,
        )  # fmt: skip
