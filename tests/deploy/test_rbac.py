"""RBAC: every (resource, verb) a worker's code uses is granted to that worker's ServiceAccount, at
the right scope, and nothing else is (least privilege; no `*`).

``USES`` is data, written by reading the code (file and call named next to each entry):
``ctx.informers(R)`` / ``Informer(...)`` = list + watch; ``reader.get/get_or_none`` = get;
``reader.list`` = list; ``writer.create`` = create; ``writer.patch_merge`` / ``add_finalizer`` /
``remove_finalizer`` = patch; ``writer.patch_status`` = patch on ``R/status``; ``writer.delete`` =
delete; ``EventRecorder`` = events create + patch (the count); ``ActionsClientPool`` = secrets get
(GitHub and proxy credentials) + configmaps get (githubServerTLS). Objects created with an
ownerReference that has ``blockOwnerDeletion: true`` need ``update`` on the owner's
``/finalizers`` (the OwnerReferencesPermissionEnforcement admission plugin).

Scope: ``ANY`` = in any (watched) namespace, so it must come from a ClusterRoleBinding;
``CONTROLLER`` = only in runnerscale-system (a Role there is enough).
``test_uses_cover_the_code`` re-greps the worker packages so a new resource in the code fails here.
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from tests.deploy.conftest import MANIFESTS, NAMESPACE, ROOT, WORKERS, Doc, load_docs

A, CORE, RBAC = "actions.github.com", "", "rbac.authorization.k8s.io"
ANY, CONTROLLER = "any namespace", "controller namespace"


def _u(group: str, resource: str, verbs: str, scope: str = ANY) -> list[tuple[str, str, str, str]]:
    return [(group, resource, verb, scope) for verb in verbs.split()]


USES: dict[str, list[tuple[str, str, str, str]]] = {
    "scale-set": [
        # shared/worker/runtime.py join_shards → shared/kube/leases.py KubeShardOwnership: one
        # member Lease per replica in the worker's own namespace (list, create, patch renewals, delete on
        # leave and of dead members' Leases; get kept for inspection)
        *_u("coordination.k8s.io", "leases", "get list create patch delete", CONTROLLER),
        # services/scale_set/worker.py: ctx.informers(AUTOSCALING_RUNNER_SETS / EPHEMERAL_RUNNER_SETS)
        # reconciler.py: reader.get_or_none(ARS), add_finalizer, _patch_ars_meta (patch_merge),
        # remove_finalizer; _write_status (patch_status)
        *_u(A, "autoscalingrunnersets", "get list watch patch"),
        *_u(A, "autoscalingrunnersets/status", "patch"),
        # build.py: ERS ownerReference block_owner_deletion=True
        *_u(A, "autoscalingrunnersets/finalizers", "update"),
        # reconciler.py _ensure_runner_set: get_or_none, create, patch_merge; _park: patch_merge; _finalize: delete
        *_u(A, "ephemeralrunnersets", "get list watch create patch delete"),
        # adopt.py via reconciler.py _adopt: _runners_of (reader.list), kept ARC runners re-parented
        # and stamped (patch_merge); the new controller ownerReference has blockOwnerDeletion
        *_u(A, "ephemeralrunners", "list patch"),
        *_u(A, "ephemeralrunnersets/finalizers", "update"),
        # worker.py: Informer(AUTOSCALING_LISTENERS, namespace=controller_namespace);
        # reconciler.py _listeners_of (reader.list), _ensure_listener (get, create, patch_merge), _delete_listeners (delete)
        *_u(A, "autoscalinglisteners", "get list watch create patch delete", CONTROLLER),
        # ctx.events (EventRecorder) on the ARS
        *_u(CORE, "events", "create patch"),
        # ctx.actions (ActionsClientPool): GitHub Secret, proxy Secrets, TLS ConfigMap
        *_u(CORE, "secrets", "get"),
        *_u(CORE, "configmaps", "get"),
        # reconciler.py _finalize: CLEANUP_DEPENDENTS → reader.get + remove_finalizer(cleanup-protection)
        *_u(CORE, "secrets", "patch"),
        *_u(CORE, "serviceaccounts", "get patch"),
        *_u(RBAC, "roles", "get patch"),
        *_u(RBAC, "rolebindings", "get patch"),
    ],
    "runner-set": [
        # shared/worker/runtime.py join_shards → shared/kube/leases.py KubeShardOwnership: one
        # member Lease per replica in the worker's own namespace (list, create, patch renewals, delete on
        # leave and of dead members' Leases; get kept for inspection)
        *_u("coordination.k8s.io", "leases", "get list create patch delete", CONTROLLER),
        # services/runner_set/controller.py: ctx.informers(EPHEMERAL_RUNNER_SETS), reader.get_or_none,
        # add_finalizer, remove_finalizer, _apply_desired (patch_merge), _patch_status
        *_u(A, "ephemeralrunnersets", "get list watch patch"),
        *_u(A, "ephemeralrunnersets/status", "patch"),
        # reconciler.py _max_runners: reader.get_or_none(AUTOSCALING_RUNNER_SETS) (the owner's maxRunners)
        *_u(A, "autoscalingrunnersets", "get"),
        # decide.new_runner: ownerReference blockOwnerDeletion True (also on the proxy Secret)
        *_u(A, "ephemeralrunnersets/finalizers", "update"),
        # ctx.informers(EPHEMERAL_RUNNERS), _runners (reader.list), writer.create, _delete_runner (delete)
        *_u(A, "ephemeralrunners", "list watch create delete"),
        # _ensure_proxy_secret: reader.get_or_none (credentials + own), create, patch_merge; _finalize: delete
        *_u(CORE, "secrets", "get create patch delete"),
        # _remove_idle: ctx.actions.for_spec (ActionsClientPool)
        *_u(CORE, "configmaps", "get"),
        *_u(CORE, "events", "create patch"),
    ],
    "runner": [
        # shared/worker/runtime.py join_shards → shared/kube/leases.py KubeShardOwnership: one
        # member Lease per replica in the worker's own namespace (list, create, patch renewals, delete on
        # leave and of dead members' Leases; get kept for inspection)
        *_u("coordination.k8s.io", "leases", "get list create patch delete", CONTROLLER),
        # services/runner/worker.py: ctx.informers(EPHEMERAL_RUNNERS); reconciler.py: get_or_none,
        # _ensure_finalizers / _job_once (patch_merge), remove_finalizer, _delete_er (delete)
        *_u(A, "ephemeralrunners", "get list watch patch delete"),
        # patch_status: runner id, failures, phase, job information
        *_u(A, "ephemeralrunners/status", "patch"),
        # build.py owner_reference: blockOwnerDeletion True (pod and JIT Secret)
        *_u(A, "ephemeralrunners/finalizers", "update"),
        # worker.py: ctx.informers(PODS, label_selector=...); reconciler.py: get_or_none, _create_pod
        # (create), delete; _cleanup_hook_objects: reader.list + delete
        *_u(CORE, "pods", "get list watch create delete"),
        # _ensure_secret (get, create, delete), _cleanup_resources (get, delete): by name only; the
        # list of _cleanup_hook_objects is OPTIONAL_USES (--cleanup-hook-secrets)
        *_u(CORE, "secrets", "get create delete"),
        # ActionsClientPool (TLS ConfigMap)
        *_u(CORE, "configmaps", "get"),
        *_u(CORE, "events", "create patch"),
    ],
    "listener-pod": [
        # shared/worker/runtime.py join_shards → shared/kube/leases.py KubeShardOwnership: one
        # member Lease per replica in the worker's own namespace (list, create, patch renewals, delete on
        # leave and of dead members' Leases; get kept for inspection)
        *_u("coordination.k8s.io", "leases", "get list create patch delete", CONTROLLER),
        # services/listener_pod/worker.py: ctx.informers(AUTOSCALING_LISTENERS / AUTOSCALING_RUNNER_SETS)
        # reconciler.py: get_or_none(AL), add_finalizer, remove_finalizer, delete (ARS gone)
        *_u(A, "autoscalinglisteners", "get list watch patch delete"),
        # build.py: ownerReference blockOwnerDeletion True on pod, ServiceAccount, config Secret
        *_u(A, "autoscalinglisteners/finalizers", "update"),
        *_u(A, "autoscalingrunnersets", "get list watch"),
        # worker.py: ctx.informers(PODS / SERVICE_ACCOUNTS / ROLES / ROLE_BINDINGS, label_selector=...) in every namespace
        *_u(CORE, "pods", "list watch"),
        *_u(CORE, "serviceaccounts", "list watch"),
        # _read_config_inputs: GitHub Secret and proxy Secrets, TLS ConfigMap in the ARS namespace
        *_u(CORE, "secrets", "get"),
        *_u(CORE, "configmaps", "get"),
        # _ensure_role / _ensure_role_binding (get, create, patch_merge, delete on roleRef change), _cleanup (delete)
        *_u(RBAC, "roles", "get list watch create patch delete"),
        *_u(RBAC, "rolebindings", "get list watch create patch delete"),
        # in the AL's namespace (= runnerscale-system): _ensure_pod (get, create, patch_merge), _recreate / _cleanup (delete)
        *_u(CORE, "pods", "get create patch delete", CONTROLLER),
        # _ensure_service_account (get, create, patch_merge), _cleanup (delete)
        *_u(CORE, "serviceaccounts", "get create patch delete", CONTROLLER),
        # _ensure_config_secret (create, patch_merge), _cleanup: <AL>-config and <AL>-proxy (delete)
        *_u(CORE, "secrets", "create patch delete", CONTROLLER),
        # EventRecorder on the AL
        *_u(CORE, "events", "create patch", CONTROLLER),
    ],
}

# Uses behind a setting that is off by default, granted by deploy/manifests/optional/rbac-<name>.yaml
# (and the chart value that enables the setting): name → (worker, setting, uses).
OPTIONAL = ROOT / "deploy" / "manifests" / "optional"
OPTIONAL_USES: dict[str, tuple[str, str, list[tuple[str, str, str, str]]]] = {
    # services/runner/reconciler.py _cleanup_hook_objects: reader.list(SECRETS, label runner-pod=<ER>)
    # only with RunnerSettings.cleanup_hook_secrets (--cleanup-hook-secrets)
    "runner-hook-secrets": ("runner", "cleanup_hook_secrets", _u(CORE, "secrets", "list")),
}

# Resource constants a worker package may use → (group, plural). Anything else used in a worker
# package fails test_uses_cover_the_code until USES (and the manifests) know it.
RESOURCE_CONSTANTS = {
    "AUTOSCALING_RUNNER_SETS": (A, "autoscalingrunnersets"),
    "EPHEMERAL_RUNNER_SETS": (A, "ephemeralrunnersets"),
    "EPHEMERAL_RUNNERS": (A, "ephemeralrunners"),
    "AUTOSCALING_LISTENERS": (A, "autoscalinglisteners"),
    "PODS": (CORE, "pods"),
    "SECRETS": (CORE, "secrets"),
    "SERVICE_ACCOUNTS": (CORE, "serviceaccounts"),
    "CONFIG_MAPS": (CORE, "configmaps"),
    "EVENTS": (CORE, "events"),
    "ROLES": (RBAC, "roles"),
    "ROLE_BINDINGS": (RBAC, "rolebindings"),
    "NAMESPACES": (CORE, "namespaces"),
    "LEASES": ("coordination.k8s.io", "leases"),
}
PACKAGES = {"scale-set": "scale_set", "runner-set": "runner_set", "runner": "runner", "listener-pod": "listener_pod"}


# --- what the manifests grant ------------------------------------------------------------------------


def _rbac_docs(docs: list[Doc] | None = None) -> list[Doc]:
    docs = load_docs(MANIFESTS) if docs is None else docs
    return [d for d in docs if d.obj["apiVersion"].startswith("rbac.authorization.k8s.io/")]


def grants(
    worker: str, docs: list[Doc] | None = None, *, account: str = "", namespace: str = NAMESPACE
) -> dict[str, set[tuple[str, str, str]]]:
    """scope → {(group, resource, verb)} granted to the worker's ServiceAccount (``account``, default
    runnerscale-<worker>, in ``namespace``) by ``docs`` (default: deploy/manifests). Scopes: ANY
    (ClusterRoleBinding), CONTROLLER (a binding in ``namespace``), or the name of another namespace
    whose RoleBinding grants it (a RoleBinding may refer to a ClusterRole: its rules then apply in
    the binding's namespace only)."""
    docs = _rbac_docs(docs)
    account = account or f"runnerscale-{worker}"
    roles = {(d.kind, d.namespace, d.name): d.obj for d in docs if d.kind in ("Role", "ClusterRole")}
    out: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    for d in docs:
        if d.kind not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(
            s["kind"] == "ServiceAccount" and s["name"] == account and s["namespace"] == namespace
            for s in d.obj["subjects"]
        ):
            continue
        ref = d.obj["roleRef"]
        role = roles[(ref["kind"], d.namespace if ref["kind"] == "Role" else "", ref["name"])]
        scope = ANY if d.kind == "ClusterRoleBinding" else (CONTROLLER if d.namespace == namespace else d.namespace)
        for rule in role["rules"]:
            assert not rule.get("resourceNames"), f"{ref['name']}: resourceNames are not modelled here"
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        out[scope].add((group, resource, verb))
    return out


def test_nothing_grants_wildcards() -> None:
    for d in _rbac_docs():
        for rule in d.obj.get("rules", []):
            for field in ("apiGroups", "resources", "verbs"):
                assert not any("*" in v for v in rule.get(field, [])), f"{d}: {field} {rule[field]}"
            assert not rule.get("nonResourceURLs"), d
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), d


def test_each_worker_has_its_own_service_account() -> None:
    accounts = {d.name for d in load_docs(MANIFESTS) if d.kind == "ServiceAccount"}
    assert accounts == {f"runnerscale-{w}" for w in WORKERS}


@pytest.mark.parametrize("worker", WORKERS)
def test_every_use_is_granted(worker: str) -> None:
    granted = grants(worker)
    missing = []
    for group, resource, verb, scope in USES[worker]:
        ok = (group, resource, verb) in granted[ANY] or (
            scope == CONTROLLER and (group, resource, verb) in granted[CONTROLLER]
        )
        if not ok:
            missing.append((group, resource, verb, scope))
    assert missing == []


@pytest.mark.parametrize("worker", WORKERS)
def test_nothing_beyond_the_uses_is_granted(worker: str) -> None:
    """Least privilege: every granted (resource, verb) is used, and a cluster-wide grant is only
    given where a use needs any namespace."""
    granted = grants(worker)
    used_any = {(g, r, v) for g, r, v, s in USES[worker] if s == ANY}
    used_all = {(g, r, v) for g, r, v, _ in USES[worker]}
    assert granted[ANY] - used_any == set(), "cluster-wide grants nobody needs cluster-wide"
    assert granted[CONTROLLER] - used_all == set()
    assert set(granted) <= {ANY, CONTROLLER}, "bindings in other namespaces"


def test_listener_pod_holds_what_its_listener_role_grants() -> None:
    """Kubernetes refuses to create a Role granting permissions its creator lacks (unless it has
    `escalate`, which we do not give): the listener-pod worker must hold the rules it writes."""
    from services.listener_pod.build import role_rules

    granted = grants("listener-pod")[ANY]
    for rule in role_rules("some-ers"):
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert (group, resource, verb) in granted


# Commands that live beside a worker but run with the user's kubeconfig, never with the worker's
# ServiceAccount: `runnerscale adopt --dry-run` (services/scale_set/adopt_cli.py) only reads.
USER_COMMANDS = frozenset({"adopt_cli.py"})


def _source(worker: str) -> str:
    files = sorted((ROOT / "services" / PACKAGES[worker]).glob("*.py"))
    return "\n".join(p.read_text() for p in files if p.name not in USER_COMMANDS)


def _resource_constants() -> dict[str, tuple[str, str]]:
    """Every Resource constant of shared.kube and shared.worker: name → (group, plural)."""
    from shared import kube, worker

    return {
        n: (v.group, v.plural)
        for m in (kube, worker)
        for n in dir(m)
        if n.isupper() and hasattr(v := getattr(m, n), "plural")
    }


def test_resource_table_is_complete() -> None:
    assert _resource_constants() == RESOURCE_CONSTANTS


@pytest.mark.parametrize("worker", WORKERS)
def test_uses_cover_the_code(worker: str) -> None:
    """Every Kubernetes resource a worker package names (a Resource constant, or a Resource it
    defines itself) has entries in USES, and every resource in USES is still named (or reached
    through shared/worker: events, secrets, configmaps)."""
    source = _source(worker)
    mentioned = {RESOURCE_CONSTANTS[name] for name in RESOURCE_CONSTANTS if re.search(rf"\b{name}\b", source)}
    mentioned |= {(g, p) for g, p in re.findall(r'Resource\(\s*"([^"]*)",\s*"[^"]+",\s*"([^"]+)"', source)}
    used = {(g, r.split("/")[0]) for g, r, _, _ in USES[worker]}
    assert mentioned <= used, f"resources in the code without RBAC data: {mentioned - used}"
    # EventRecorder, ActionsClientPool, and the shard-ownership Leases the runtime holds
    via_runtime = {(CORE, "events"), (CORE, "secrets"), (CORE, "configmaps"), ("coordination.k8s.io", "leases")}
    assert used - mentioned <= via_runtime, (
        f"USES lists resources the code no longer names: {used - mentioned - via_runtime}"
    )
    assert not re.search(r"\bwriter\.replace\(", source), (
        "a PUT appeared: add the update verb to USES and the manifests"
    )


def test_the_runtime_holds_shard_leases_in_kubernetes_by_default() -> None:
    """The leases entry of every worker is real: the runtime joins KubeShardOwnership by default,
    which lists, creates, patches and deletes coordination.k8s.io Leases."""
    from shared.worker.settings import WorkerSettings

    assert WorkerSettings().ownership == "kube"
    runtime = (ROOT / "shared" / "worker" / "runtime.py").read_text()
    # whitespace-free, so the formatter's line wrapping does not matter
    leases = "".join((ROOT / "shared" / "kube" / "leases.py").read_text().split())
    assert "KubeShardOwnership" in runtime
    for call in ("reader.list(LEASES", "writer.create(LEASES", "writer.patch_merge(LEASES", "writer.delete(LEASES"):
        assert call in leases, call


def test_events_and_credentials_come_from_the_runtime() -> None:
    """The via-runtime entries above are real: EventRecorder writes core Events (create, then a
    merge patch of the count) and ActionsClientPool reads Secrets and ConfigMaps."""
    events = (ROOT / "shared" / "kube" / "events.py").read_text()
    assert re.search(r"writer\.create\(\s*EVENTS", events) and re.search(r"writer\.patch_merge\(\s*EVENTS", events)
    pool = (ROOT / "shared" / "worker" / "actions_pool.py").read_text()
    assert re.search(r"reader\.get\(\s*SECRETS", pool) and re.search(r"reader\.get\(\s*CONFIG_MAPS", pool)


@pytest.mark.parametrize("name", OPTIONAL_USES)
def test_optional_manifest_grants_exactly_its_uses(name: str) -> None:
    """deploy/manifests/optional/rbac-<name>.yaml adds exactly the optional uses, at their scope,
    to the worker's ServiceAccount, and the default manifests do not grant them."""
    worker, _, uses = OPTIONAL_USES[name]
    extra = load_docs(OPTIONAL)
    assert {d.path.name for d in extra} == {f"rbac-{n}.yaml" for n in OPTIONAL_USES}
    base, both = grants(worker), grants(worker, load_docs(MANIFESTS) + extra)
    added = {scope: both[scope] - base.get(scope, set()) for scope in both}
    wanted: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    for group, resource, verb, scope in uses:
        wanted[scope].add((group, resource, verb))
        assert (group, resource, verb) not in base[ANY] | base[CONTROLLER], "granted by default"
    assert {s: v for s, v in added.items() if v} == dict(wanted)


def test_hook_secret_list_is_behind_its_setting() -> None:
    """The only Secret list in the runner worker is the container-hook cleanup, and it happens only
    with cleanup_hook_secrets (the scenario tests in tests/scenario/test_runner_lifecycle.py show
    both sides); the setting is off by default."""
    from services.runner.decide import RunnerSettings

    assert RunnerSettings().cleanup_hook_secrets is False
    source = (ROOT / "services" / "runner" / "reconciler.py").read_text()
    assert "(PODS, SECRETS) if self.settings.cleanup_hook_secrets else (PODS,)" in source
    assert not re.search(r"reader\.list\(\s*SECRETS", _source("runner"))
