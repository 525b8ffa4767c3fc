"""Helpers of the deploy/ tests: the YAML documents, the Kubernetes API emulator as a subprocess,
and a discovery-only API stub for `kubectl apply --dry-run=client` of kinds the emulator does not
serve (Deployments, StatefulSets, Jobs, Services, ClusterRoles, ...)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from shared.bus import permissions as bus_permissions

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MANIFESTS = DEPLOY / "manifests"
NATS = DEPLOY / "nats"
MONITORING = MANIFESTS / "monitoring"
EXAMPLES = DEPLOY / "examples"
DASHBOARD = DEPLOY / "dashboards" / "runnerscale.json"
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
RUNNERSCALE = str(Path(sys.executable).parent / "runnerscale")
NAMESPACE = "runnerscale-system"
WORKERS = ("scale-set", "runner-set", "runner", "listener-pod")
INSTALL_DIRS = (MANIFESTS, NATS)  # what README "Deploying to a cluster" installs into runnerscale-system


@dataclass(frozen=True)
class Doc:
    path: Path
    index: int
    obj: dict[str, Any]

    @property
    def kind(self) -> str:
        kind: str = self.obj.get("kind", "")
        return kind

    @property
    def name(self) -> str:
        name: str = self.obj.get("metadata", {}).get("name", "")
        return name

    @property
    def namespace(self) -> str:
        namespace: str = self.obj.get("metadata", {}).get("namespace", "")
        return namespace

    def __repr__(self) -> str:
        return f"{self.path.relative_to(ROOT)}[{self.index}] {self.kind}/{self.name}"


def yaml_files(directory: Path) -> list[Path]:
    """What `kubectl apply -f DIR` reads: *.yaml, *.yml, *.json directly in DIR."""
    return sorted(p for p in directory.iterdir() if p.is_file() and p.suffix in (".yaml", ".yml", ".json"))


def load_docs(*directories: Path) -> list[Doc]:
    docs: list[Doc] = []
    for directory in directories:
        for path in yaml_files(directory):
            for i, obj in enumerate(yaml.safe_load_all(path.read_text())):
                if obj is not None:
                    docs.append(Doc(path, i, obj))
    return docs


#: The Secret `runnerscale bus secret | kubectl apply -f -` creates before `kubectl apply -k deploy/nats`
#: (README "Authentication and permissions"); fixed passwords here so that tests can compare them.
NATS_AUTH_PASSWORDS = {c: f"test-password-{c}" for c in bus_permissions.COMPONENTS}


def nats_auth_doc() -> Doc:
    return Doc(Path("runnerscale bus secret"), 0, bus_permissions.auth_secret(NAMESPACE, passwords=NATS_AUTH_PASSWORDS))


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d.kind == kind and d.name == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {found}"
    return found[0]


def deployment_of(worker: str) -> dict[str, Any]:
    return find(load_docs(MANIFESTS), "Deployment", f"runnerscale-{worker}").obj


def kubectl(*args: str, kubeconfig: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env["HOME"] = str(kubeconfig.parent)  # no ~/.kube cache or config of the developer
    return subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "stub", "cluster": {"server": server}}],
                "users": [{"name": "stub", "user": {"token": "dummy"}}],
                "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub", "namespace": "default"}}],
                "current-context": "stub",
            }
        )
    )
    return path


@pytest.fixture(scope="session")
def helm() -> Path:
    """The helm binary, built from the Go module proxy on first use (tests/tools/helm.py). Without
    Go the test fails and says how to get it: nothing is skipped."""
    from tests.tools.helm import HelmUnavailable, ensure_helm

    try:
        return ensure_helm()
    except HelmUnavailable as exc:
        pytest.fail(f"helm is not available: {exc}")


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Replaces ``anyio.run`` (the start of a worker's event loop) to capture what a worker's
    ``main(argv)`` would run, and clears the runnerscale environment of the test process."""
    calls: list[tuple[Any, ...]] = []

    def fake_run(func: Any, *args: Any, **kwargs: Any) -> int:
        calls.append((func, *args))
        return 0

    monkeypatch.setattr(anyio, "run", fake_run)
    for name in list(os.environ):
        if name.startswith(("RUNNERSCALE_", "CONTROLLER_MANAGER_", "KUBE")) or name in (
            "POD_NAME",
            "POD_NAMESPACE",
            "LISTENER_CONFIG_PATH",
        ):
            monkeypatch.delenv(name)
    return calls


# --- the API emulator as a subprocess ------------------------------------------------------------


@dataclass
class Emulator:
    url: str
    kubeconfig: Path
    proc: subprocess.Popen[str]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """`runnerscale apiserver --port 0 --kubeconfig-out FILE --crds deploy/crds`, stopped by PID."""
    workdir = tmp_path_factory.mktemp("emulator")
    kubeconfig = workdir / "kubeconfig"
    proc = subprocess.Popen(
        [RUNNERSCALE, "apiserver", "--port", "0", "--kubeconfig-out", str(kubeconfig), "--crds", str(DEPLOY / "crds")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    watchdog = threading.Timer(30, proc.kill)  # a hung start fails the test instead of blocking it
    watchdog.start()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # printed once it listens
        watchdog.cancel()
        assert line.startswith("http://"), f"emulator did not start (exit {proc.poll()}): {line!r}"
        yield Emulator(line, kubeconfig, proc)
    finally:
        watchdog.cancel()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


# --- a discovery-only API stub ---------------------------------------------------------------------

# (group, version, plural, kind, namespaced): the built-in kinds deploy/ uses, as a 1.34 server
# lists them, plus the Prometheus operator's kinds for deploy/manifests/monitoring.
STUB_RESOURCES: tuple[tuple[str, str, str, str, bool], ...] = (
    ("", "v1", "namespaces", "Namespace", False),
    ("", "v1", "serviceaccounts", "ServiceAccount", True),
    ("", "v1", "configmaps", "ConfigMap", True),
    ("", "v1", "secrets", "Secret", True),
    ("", "v1", "services", "Service", True),
    ("", "v1", "pods", "Pod", True),
    ("apps", "v1", "deployments", "Deployment", True),
    ("apps", "v1", "statefulsets", "StatefulSet", True),
    ("batch", "v1", "jobs", "Job", True),
    ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    ("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    ("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor", True),
    ("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor", True),
    ("monitoring.coreos.com", "v1", "prometheusrules", "PrometheusRule", True),
)
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def _discovery(path: str) -> dict[str, Any] | None:
    if path == "/version":
        return {"major": "1", "minor": "34", "gitVersion": "v1.34.0-stub", "platform": "linux/amd64"}
    if path == "/api":
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
        }
    groups: dict[str, list[str]] = {}
    for g, v, *_ in STUB_RESOURCES:
        if g and v not in groups.setdefault(g, []):
            groups[g].append(v)
    if path == "/apis":
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                    "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                }
                for g, vs in groups.items()
            ],
        }
    for g, vs in [("", ["v1"]), *groups.items()]:
        for v in vs:
            gv = f"{g}/{v}" if g else v
            if path == (f"/apis/{gv}" if g else f"/api/{v}"):
                return {
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": gv,
                    "resources": [
                        {"name": plural, "singularName": kind.lower(), "namespaced": ns, "kind": kind, "verbs": VERBS}
                        for rg, rv, plural, kind, ns in STUB_RESOURCES
                        if rg == g and rv == v
                    ],
                }
    return None


class _StubHandler(BaseHTTPRequestHandler):
    requests: list[tuple[str, str]]

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        self.server.requests.append(("GET", path))  # type: ignore[attr-defined]
        body = _discovery(path)
        if body is not None:
            self._send(200, body)
            return
        # Every object is absent: `apply` then takes the create path (and, with --dry-run=client,
        # sends nothing).
        self._send(
            404,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": f"{path} not found",
                "reason": "NotFound",
                "code": 404,
            },
        )

    def _refuse(self) -> None:
        self.server.requests.append((self.command, self.path))  # type: ignore[attr-defined]
        self._send(
            405,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": "stub is read-only",
                "reason": "MethodNotAllowed",
                "code": 405,
            },
        )

    do_POST = do_PUT = do_PATCH = do_DELETE = _refuse


@dataclass
class Stub:
    url: str
    kubeconfig: Path
    requests: list[tuple[str, str]]


@pytest.fixture(scope="module")
def discovery_stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stub]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StubHandler)
    server.requests = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield Stub(url, write_kubeconfig(tmp_path_factory.mktemp("stub") / "kubeconfig", url), server.requests)  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
