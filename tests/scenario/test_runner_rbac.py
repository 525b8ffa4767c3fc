"""The runner worker on a real API server with only the RBAC deploy/manifests give it (README
"RBAC"): as its own ServiceAccount (a bearer token from the TokenRequest API), its rules bound in the
test's namespace. By default it lists no Secrets; the container-hook Secret cleanup needs the
optional grant (deploy/manifests/optional/rbac-runner-hook-secrets.yaml). Skipped on the emulator,
which stores RBAC objects but authorizes everything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from shared.kube import EPHEMERAL_RUNNERS
from shared.worker import WorkerSettings
from tests.deploy.conftest import MANIFESTS, find, kubectl, load_docs
from tests.deploy.test_rbac import OPTIONAL
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.apiserver import KubeApi
from tests.scenario.conftest import Kube, wait_for
from tests.scenario.test_runner_helpers import FAST, runner_template, start_runner_env
from tests.scenario.test_runner_lifecycle import _hook_leftovers, _registered

pytestmark = [pytest.mark.anyio, pytest.mark.kubectl]

ACCOUNT = "runner-under-test"
HOOKS = [{"name": "ACTIONS_RUNNER_CONTAINER_HOOKS", "value": "/home/runner/k8s/index.js"}]


def _apply(kubeconfig: Path, tmp_path: Path, name: str, docs: list[dict[str, Any]]) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    got = kubectl("apply", "-f", str(path), kubeconfig=kubeconfig)
    assert got.returncode == 0, got.stderr


def _role(namespace: str, name: str, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A Role with ``rules`` in ``namespace`` bound to the account (namespaced: it goes with the
    test's namespace; the worker watches that namespace only)."""
    meta = {"name": name, "namespace": namespace}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}],
        },
    ]


def _account_kubeconfig(kubeconfig: Path, tmp_path: Path, namespace: str) -> Path:
    got = kubectl("create", "token", ACCOUNT, "-n", namespace, "--duration=1h", kubeconfig=kubeconfig)
    assert got.returncode == 0, got.stderr
    config = yaml.safe_load(kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": got.stdout.strip()}
    path = tmp_path / "runner-account.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


async def test_runner_worker_runs_with_its_manifest_rbac(
    kube_api: KubeApi,
    kube: Kube,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
    tmp_path: Path,
) -> None:
    if kube_api.is_emulator:
        pytest.skip("RBAC enforcement needs a real API server: the emulator authorizes everything")
    admin = Path(kube_api.kubeconfig)
    docs = load_docs(MANIFESTS)
    rules = find(docs, "ClusterRole", "runnerscale-runner").obj["rules"]
    rules = rules + find(docs, "Role", "runnerscale-runner").obj["rules"]  # shard leases (lease_namespace)
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT, "namespace": namespace}}
    _apply(admin, tmp_path, "rbac", [account, *_role(namespace, "runner", rules)])
    as_account = _account_kubeconfig(admin, tmp_path, namespace)

    def settings(replica: str = "r0", **overrides: Any) -> Any:
        return worker_settings(replica, kubeconfig=str(as_account), **overrides)

    errors = {"controller": "ephemeralrunner"}
    hooks = runner_template(env=HOOKS)
    cleanup = msgspec.structs.replace(FAST, cleanup_hook_secrets=True)

    # default settings: the whole lifecycle with the manifest's rules, hook Secrets left alone
    async with start_runner_env(kube, namespace, actions_sim, github_secret, settings) as env:
        registry = env.worker.ctx.registry
        await env.create_er("er-default", template=hooks)
        await _registered(env, "er-default")
        await _hook_leftovers(env, "er-default")
        await kube.writer.delete(EPHEMERAL_RUNNERS, env.key("er-default"))
        await env.wait_gone("er-default")
        assert (registry.get_sample_value("controller_runtime_reconcile_errors_total", errors) or 0) == 0
        assert await env.secret_of("er-default-env") is not None

    # --cleanup-hook-secrets without the optional grant: refused (403), the runner stays
    async with start_runner_env(kube, namespace, actions_sim, github_secret, settings, settings=cleanup) as env:
        registry = env.worker.ctx.registry
        await env.create_er("er-cleanup", template=hooks)
        await _registered(env, "er-cleanup")
        await _hook_leftovers(env, "er-cleanup")
        await kube.writer.delete(EPHEMERAL_RUNNERS, env.key("er-cleanup"))
        await wait_for(
            lambda: (registry.get_sample_value("controller_runtime_reconcile_errors_total", errors) or 0) > 0,
            what="the Secret list refused",
        )
        assert await env.er("er-cleanup") is not None

        # ... and with it (the optional manifest's rules): the hook Secret goes, another's stays
        optional = find(load_docs(OPTIONAL), "ClusterRole", "runnerscale-runner-hook-secrets").obj["rules"]
        _apply(admin, tmp_path, "optional", _role(namespace, "runner-hook-secrets", optional))
        await env.wait_gone("er-cleanup", timeout=60.0)  # retried with the controller's backoff
        assert await env.secret_of("er-cleanup-env") is None
        assert await env.secret_of("er-cleanup-other") is not None
