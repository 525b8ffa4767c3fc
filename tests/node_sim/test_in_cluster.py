"""Process pods get what in-cluster clients read: ``KUBERNETES_SERVICE_HOST/PORT`` and the
service-account token, CA and namespace files of the pod's ``kube-api-access-*`` volume.

Two real in-cluster clients run as node-sim process pods: client-go (``tests/goclient
-in-cluster``, building its config as ``rest.InClusterConfig`` does, with the files from
``$RUNNERSCALE_SERVICEACCOUNT_DIR``) and runnerscale's own loader (``KubeClient.connect()``,
kubernetes-asyncio's ``load_incluster_config``). Each talks HTTPS to the API server as the
service account and leaves a ConfigMap behind. In-cluster clients only speak HTTPS: on the
emulator this runs against a private ``--tls`` emulator; on a real cluster against it directly.
"""

from __future__ import annotations

import secrets
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.embedded.apiserver import BackgroundEmulator, emulator_tls_material
from services.embedded.node_sim.kube import KubeError, KubeRest
from tests.fixtures.apiserver import KubeApi
from tests.goclient import build

from .helpers import create, node_config, phase, pod_body, running_node, wait_pod, wait_until

pytestmark = pytest.mark.anyio

PY_CLIENT = textwrap.dedent(
    """
    import asyncio, json, os, pathlib
    from shared.kube.client import KubeClient

    async def main():
        ns = pathlib.Path(os.environ["RUNNERSCALE_SERVICEACCOUNT_DIR"], "namespace").read_text().strip()
        async with await KubeClient.connect() as kube:  # in-cluster: KUBERNETES_SERVICE_HOST is set
            base = f"/api/v1/namespaces/{ns}/configmaps"
            root = json.loads(await kube.request("GET", base + "/kube-root-ca.crt", what="get root CA"))
            body = {"metadata": {"name": "py-in-cluster-ok"}, "data": {"ca": root["data"]["ca.crt"][:27]}}
            await kube.request("POST", base, body=body, what="create marker")

    asyncio.run(main())
    """
)


@dataclass(frozen=True)
class HttpsApi:
    url: str
    kubeconfig: Path


@pytest.fixture(scope="module")
def https_api(kube_api: KubeApi, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpsApi]:
    """An HTTPS API server: the real cluster under test, or a private ``--tls`` emulator."""
    if not kube_api.is_emulator:
        # kube_api.url may be a kubectl proxy; the kubeconfig names the server itself.
        if not kube_api.server_url.startswith("https://"):
            pytest.skip(
                "in-cluster clients speak HTTPS only: RUNNERSCALE_KUBECONFIG names a plain-HTTP endpoint "
                "(kubectl proxy); point it at the cluster's TLS kubeconfig to run this"
            )
        yield HttpsApi(url=kube_api.server_url, kubeconfig=kube_api.kubeconfig)
        return
    bg = BackgroundEmulator(tls=emulator_tls_material())
    emu = bg.start()
    try:
        kubeconfig = emu.write_kubeconfig(tmp_path_factory.mktemp("tls-kube") / "kubeconfig")
        yield HttpsApi(url=emu.url, kubeconfig=kubeconfig)
    finally:
        bg.stop()


@pytest.fixture
async def kube(https_api: HttpsApi) -> AsyncIterator[KubeRest]:
    k = await KubeRest.from_kubeconfig(https_api.kubeconfig)
    try:
        yield k
    finally:
        await k.close()


@pytest.fixture
async def tls_namespace(kube: KubeRest) -> AsyncIterator[str]:
    """A namespace whose default service account may read and create ConfigMaps (real RBAC)."""
    ns = "t-" + secrets.token_hex(4)
    await kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    try:
        # A real cluster's controllers add the default account shortly after the namespace.
        await wait_until(lambda: kube.get("serviceaccounts", ns, "default"), what="the default ServiceAccount")
        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
        rule = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create"]}
        await kube.request("POST", f"{rbac}/roles", body={"metadata": {"name": "cm"}, "rules": [rule]})
        binding = {
            "metadata": {"name": "cm"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm"},
        }
        await kube.request("POST", f"{rbac}/rolebindings", body=binding)
        yield ns
    finally:
        try:
            await kube.request("DELETE", f"/api/v1/namespaces/{ns}")
        except KubeError as exc:
            if exc.status != 404:
                raise


@pytest.mark.timeout(1800)  # includes the Go build on a cold cache
async def test_in_cluster_clients_run_as_process_pods(
    https_api: HttpsApi, kube: KubeRest, tls_namespace: str, tmp_path: Path
) -> None:
    try:
        goclient = build.build()["goclient"]
    except build.GoMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    ns = tls_namespace
    exec_pod = {"runnerscale.dev/node-sim-exec": "true"}
    pods = {
        "go": pod_body(
            "go",
            containers=[{"name": "main", "image": "goclient", "command": [str(goclient), "-in-cluster"]}],
            restart_policy="Never",
            annotations=exec_pod,
        ),
        "py": pod_body(
            "py",
            containers=[{"name": "main", "image": "python", "command": [sys.executable, "-c", PY_CLIENT]}],
            restart_policy="Never",
            annotations=exec_pod,
        ),
    }
    cfg = node_config(https_api, ns, tmp_path, node_name=f"node-sim-{secrets.token_hex(3)}")
    async with running_node(cfg) as node:
        for body in pods.values():
            await create(kube, ns, "pods", body)
        for name in pods:
            done = await wait_pod(
                kube, ns, name, lambda p: phase(p) in ("Succeeded", "Failed"), timeout=60, what="a terminal phase"
            )
            assert phase(done) == "Succeeded", (name, done.get("status"), node.logs(ns, name, "main"))
    made = await kube.get("configmaps", ns, "in-cluster-ok")
    assert made is not None and made["data"]["host"] == https_api.url.rstrip("/")
    made = await kube.get("configmaps", ns, "py-in-cluster-ok")
    assert made is not None and made["data"]["ca"] == "-----BEGIN CERTIFICATE-----"
