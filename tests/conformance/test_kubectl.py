"""kubectl 1.32 against the API under test: apply CRDs and an ARC manifest, get (printer columns),
patch, label, annotate, get -w, wait --for=jsonpath, delete --wait with a finalizer, -o yaml."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.apiserver import KubeApi

REPO = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
# kubectl is part of every machine this project runs its tests on; a missing one must fail, not skip.
pytestmark = [pytest.mark.kubectl]


def test_kubectl_is_installed() -> None:
    assert Path(KUBECTL).exists(), (
        "kubectl is required by the conformance suite (install it, e.g. apt-get install kubectl)"
    )


class Kubectl:
    def __init__(self, kube_api: KubeApi, cache_dir: Path) -> None:
        self.base = [
            KUBECTL,
            "--kubeconfig",
            str(kube_api.kubeconfig),
            "--cache-dir",
            str(cache_dir),
            "--request-timeout",
            "20s",
        ]

    def __call__(self, *args: str, stdin: str | None = None, timeout: float = 30) -> str:
        proc = subprocess.run(
            [*self.base, *args], input=stdin, check=False, capture_output=True, text=True, timeout=timeout
        )
        assert proc.returncode == 0, f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr}"
        return proc.stdout

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([*self.base, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)  # polling a condition under a deadline
    raise AssertionError(f"timed out waiting for {what}")


def _crd_source() -> Path:
    deploy = REPO / "deploy" / "crds"
    assert any(deploy.glob("*.yaml")), "deploy/crds/ has no CRDs"
    return deploy


def _ars_manifest(namespace: str) -> str:
    sample = REPO / "tests" / "data" / "arc" / "ars-minimal.yaml"
    doc = yaml.safe_load(sample.read_text())
    doc["metadata"]["namespace"] = namespace
    return yaml.safe_dump(doc)


def test_kubectl_workflow(kube_api: KubeApi, namespace: str, tmp_path: Path) -> None:
    k = Kubectl(kube_api, tmp_path / "cache")
    out = k("apply", "-f", str(_crd_source()))
    assert "autoscalingrunnersets.actions.github.com" in out
    out = k("apply", "-f", "-", stdin=_ars_manifest(namespace))
    assert "autoscalingrunnerset.actions.github.com/minimal" in out
    out = k("apply", "-f", "-", stdin=_ars_manifest(namespace))  # a second apply is a no-op
    assert "unchanged" in out

    table = k("-n", namespace, "get", "autoscalingrunnersets")
    header = table.splitlines()[0]
    # ARC's printer columns, in ARC's order (priority-0 columns only; AGE is kubectl's own).
    arc_columns = [
        "NAME",
        "MINIMUM RUNNERS",
        "MAXIMUM RUNNERS",
        "CURRENT RUNNERS",
        "PHASE",
        "PENDING RUNNERS",
        "RUNNING RUNNERS",
        "FINISHED RUNNERS",
        "DELETING RUNNERS",
    ]
    positions = [header.find(c) for c in arc_columns]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), header
    wide = k("-n", namespace, "get", "autoscalingrunnersets", "-o", "wide").splitlines()[0]
    assert "GENERATION" in wide and "OBSERVED GENERATION" in wide, wide  # the typed-state columns

    watcher = k.popen(
        "-n",
        namespace,
        "get",
        "autoscalingrunnersets",
        "-w",
        "-o",
        "custom-columns=NAME:.metadata.name,MAX:.spec.maxRunners",
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(watcher.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        _wait_for(lambda: any(line.startswith("minimal") for line in lines), 20, "the watch's first row")
        assert "patched" in k(
            "-n",
            namespace,
            "patch",
            "autoscalingrunnerset",
            "minimal",
            "--type",
            "merge",
            "-p",
            '{"spec":{"maxRunners":5}}',
        )
        _wait_for(lambda: any(line.split()[-1:] == ["5"] for line in lines), 20, "kubectl get -w to show maxRunners=5")
    finally:
        watcher.terminate()
        watcher.wait(timeout=10)

    assert "labeled" in k("-n", namespace, "label", "autoscalingrunnerset", "minimal", "team=ci")
    assert "annotated" in k(
        "-n", namespace, "annotate", "autoscalingrunnerset", "minimal", "runnerscale.dev/note=hello"
    )
    out = k(
        "-n", namespace, "wait", "autoscalingrunnerset/minimal", "--for=jsonpath={.spec.maxRunners}=5", "--timeout=20s"
    )
    assert "condition met" in out

    doc = yaml.safe_load(k("-n", namespace, "get", "autoscalingrunnerset", "minimal", "-o", "yaml"))
    assert int(doc["metadata"]["resourceVersion"]) > 0
    assert doc["metadata"]["generation"] == 2  # the maxRunners patch; label/annotate do not count
    assert doc["metadata"]["labels"] == {"team": "ci"}
    assert doc["metadata"]["annotations"]["runnerscale.dev/note"] == "hello"

    k(
        "-n",
        namespace,
        "patch",
        "autoscalingrunnerset",
        "minimal",
        "--type",
        "merge",
        "-p",
        '{"metadata":{"finalizers":["runnerscale.dev/test-hold"]}}',
    )
    deleter = k.popen("-n", namespace, "delete", "autoscalingrunnerset", "minimal", "--wait=true", "--timeout=30s")
    try:
        _wait_for(
            lambda: (
                k(
                    "-n",
                    namespace,
                    "get",
                    "autoscalingrunnerset",
                    "minimal",
                    "-o",
                    "jsonpath={.metadata.deletionTimestamp}",
                ).strip()
                != ""
            ),
            20,
            "deletionTimestamp to be set",
        )
        assert deleter.poll() is None  # still waiting: the finalizer holds the object
        k(
            "-n",
            namespace,
            "patch",
            "autoscalingrunnerset",
            "minimal",
            "--type",
            "merge",
            "-p",
            '{"metadata":{"finalizers":null}}',
        )
        out, err = deleter.communicate(timeout=30)
    finally:
        if deleter.poll() is None:
            deleter.kill()
            deleter.wait(timeout=10)
    assert deleter.returncode == 0, err
    assert 'autoscalingrunnerset.actions.github.com "minimal" deleted' in out
    gone = subprocess.run(
        [*k.base, "-n", namespace, "get", "autoscalingrunnerset", "minimal"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_kubectl_core_resources(kube_api: KubeApi, namespace: str, tmp_path: Path) -> None:
    k = Kubectl(kube_api, tmp_path / "cache")
    manifest: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": namespace},
        "data": {"a": "1"},
    }
    assert "created" in k("apply", "-f", "-", stdin=yaml.safe_dump(manifest))
    manifest["data"]["b"] = "2"
    assert "configured" in k("apply", "-f", "-", stdin=yaml.safe_dump(manifest))
    assert k("-n", namespace, "get", "configmap", "settings", "-o", "jsonpath={.data.b}") == "2"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    k("apply", "-f", "-", stdin=yaml.safe_dump(pod))
    table = k("-n", namespace, "get", "pods")
    assert table.splitlines()[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert "Pending" in table
    assert 'pod "p" deleted' in k("-n", namespace, "delete", "pod", "p", "--wait=true", "--timeout=20s")
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "e1", "namespace": namespace},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": namespace},
        "reason": "Started",
        "message": "hello",
        "type": "Normal",
    }
    k("apply", "-f", "-", stdin=yaml.safe_dump(event))
    lines = k("-n", namespace, "get", "events").splitlines()
    assert lines[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert lines[1].split()[1:] == ["Normal", "Started", "pod/p", "hello"]


def test_kubectl_create_generators_send_protobuf(kube_api: KubeApi, namespace: str, tmp_path: Path) -> None:
    """`kubectl create <kind>` sends protobuf bodies; the ARC quick start uses exactly these."""
    import base64

    k = Kubectl(kube_api, tmp_path / "cache")
    ns = namespace + "-pb"
    try:
        assert "created" in k("create", "namespace", ns)
        k("-n", ns, "create", "secret", "generic", "github-token", "--from-literal=github_token=abc123")
        k("-n", ns, "create", "configmap", "cfg", "--from-literal=a=1")
        k("-n", ns, "create", "serviceaccount", "runner")
        k("-n", ns, "create", "role", "r", "--verb=get", "--resource=pods")
        k("-n", ns, "create", "rolebinding", "rb", "--role=r", f"--serviceaccount={ns}:runner")
        secret = yaml.safe_load(k("-n", ns, "get", "secret", "github-token", "-o", "yaml"))
        assert base64.b64decode(secret["data"]["github_token"]) == b"abc123" and secret["type"] == "Opaque"
        assert yaml.safe_load(k("-n", ns, "get", "configmap", "cfg", "-o", "yaml"))["data"] == {"a": "1"}
        role = yaml.safe_load(k("-n", ns, "get", "role", "r", "-o", "yaml"))
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
        rb = yaml.safe_load(k("-n", ns, "get", "rolebinding", "rb", "-o", "yaml"))
        assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"}
        assert rb["subjects"] == [{"kind": "ServiceAccount", "name": "runner", "namespace": ns}]
    finally:
        subprocess.run(
            [*k.base, "delete", "namespace", ns, "--wait=false"], check=False, capture_output=True, timeout=30
        )
