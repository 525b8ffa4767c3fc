"""Starting and stopping etcd + kube-apiserver + kube-controller-manager on loopback.

Everything lives in one state directory (PKI, etcd data, kubeconfigs, logs, ``state.json``); stopping
removes it. Ports are free ports picked at start. ``state.json`` records the process ids together
with each binary's path, so ``down`` from another process never signals a recycled pid.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import pki as pki_mod

SERVICE_CIDR = "10.0.0.0/24"
STATE_FILE = "state.json"
START_TIMEOUT_SECONDS = 180.0  # generous: a start takes ~10 s idle, much more on a loaded 2-core machine
STOP_GRACE_SECONDS = 15.0
_PR_SET_PDEATHSIG = 1


class StartError(RuntimeError):
    """The control plane did not come up; the message carries the failing component's log tail."""


@dataclass
class Component:
    name: str
    pid: int
    exe: str
    log: str


@dataclass
class Running:
    """A started control plane, as recorded in ``<state_dir>/state.json``."""

    state_dir: str
    server: str
    kubeconfig: str
    components: list[Component] = field(default_factory=list)
    # The processes this process started (not saved): stopping waits on them, so none is left
    # unreaped or garbage-collected while running.
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False, compare=False)

    def save(self) -> None:
        doc = {
            "state_dir": self.state_dir,
            "server": self.server,
            "kubeconfig": self.kubeconfig,
            "components": [asdict(c) for c in self.components],
        }
        (Path(self.state_dir) / STATE_FILE).write_text(json.dumps(doc, indent=2))

    @classmethod
    def load(cls, state_dir: Path) -> Running | None:
        path = state_dir / STATE_FILE
        if not path.is_file():
            return None
        doc = json.loads(path.read_text())
        doc["components"] = [Component(**c) for c in doc.get("components", [])]
        return cls(**doc)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def kubeconfig_doc(server: str, ca: Path, cert: Path, key: Path, user: str) -> dict[str, Any]:
    """A self-contained kubeconfig (certificates inline), so the file can be copied anywhere."""

    def data(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "runnerscale", "cluster": {"server": server, "certificate-authority-data": data(ca)}}],
        "users": [{"name": user, "user": {"client-certificate-data": data(cert), "client-key-data": data(key)}}],
        "contexts": [{"name": "runnerscale", "context": {"cluster": "runnerscale", "user": user}}],
        "current-context": "runnerscale",
    }


def _tls_context(p: pki_mod.Pki) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(p.ca.cert))
    ctx.load_cert_chain(str(p.admin.cert), str(p.admin.key))
    return ctx


def _get(url: str, ctx: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()
    except (OSError, ValueError):
        return 0, b""


def _tail(path: str, lines: int = 25) -> str:
    try:
        return "".join(Path(path).read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return "(no log)"


_prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before any fork


def _die_with_parent() -> None:
    # The test session owns this control plane: if it is killed outright, so is the cluster.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class _Starter:
    def __init__(self, bin_dir: Path, state_dir: Path, tie_to_parent: bool, deadline: float) -> None:
        self.bin_dir = bin_dir
        self.state = state_dir
        self.tie_to_parent = tie_to_parent
        self.deadline = deadline
        self.components: list[Component] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, args: list[str]) -> Component:
        exe = str(self.bin_dir / name)
        log = self.state / "logs" / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [exe, *args],
                cwd=self.state,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if self.tie_to_parent else None,  # noqa: PLW1509 - one syscall, no locks
            )
        comp = Component(name=name, pid=proc.pid, exe=exe, log=str(log))
        self.components.append(comp)
        self.procs.append(proc)
        return comp

    def wait(self, comp: Component, what: str, check: Callable[[], bool]) -> None:
        proc = self.procs[self.components.index(comp)]
        while time.monotonic() < self.deadline:
            if proc.poll() is not None:
                raise StartError(f"{comp.name} exited with code {proc.returncode}; log {comp.log}:\n{_tail(comp.log)}")
            if check():
                return
            time.sleep(0.1)  # bounded poll of a readiness endpoint
        raise StartError(f"{comp.name}: {what} not reached in time; log {comp.log}:\n{_tail(comp.log)}")


def start(
    bin_dir: Path, state_dir: Path, *, tie_to_parent: bool = False, timeout: float = START_TIMEOUT_SECONDS
) -> Running:
    """Start the three components (in order, each ready before the next) and record them."""
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    keys = pki_mod.generate(state_dir / "pki")
    etcd_client, etcd_peer, api_port = free_port(), free_port(), free_port()
    server = f"https://127.0.0.1:{api_port}"
    admin_kubeconfig = state_dir / "admin.kubeconfig"
    kcm_kubeconfig = state_dir / "controller-manager.kubeconfig"
    admin_kubeconfig.write_text(
        yaml.safe_dump(kubeconfig_doc(server, keys.ca.cert, keys.admin.cert, keys.admin.key, "admin"))
    )
    kcm_kubeconfig.write_text(
        yaml.safe_dump(
            kubeconfig_doc(
                server,
                keys.ca.cert,
                keys.controller_manager.cert,
                keys.controller_manager.key,
                "system:kube-controller-manager",
            )
        )
    )
    admin_kubeconfig.chmod(0o600)
    kcm_kubeconfig.chmod(0o600)
    starter = _Starter(bin_dir, state_dir, tie_to_parent, time.monotonic() + timeout)
    running = Running(
        state_dir=str(state_dir),
        server=server,
        kubeconfig=str(admin_kubeconfig),
        components=starter.components,  # the same lists: whatever is spawned is recorded at once
        processes=starter.procs,
    )
    try:
        etcd_url, peer_url = f"http://127.0.0.1:{etcd_client}", f"http://127.0.0.1:{etcd_peer}"
        etcd = starter.spawn(
            "etcd",
            [
                "--name", "default",
                "--data-dir", str(state_dir / "etcd"),
                "--listen-client-urls", etcd_url,
                "--advertise-client-urls", etcd_url,
                "--listen-peer-urls", peer_url,
                "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"default={peer_url}",
                "--unsafe-no-fsync",  # test data: durability is not worth the fsync latency
                "--log-level", "warn",
            ],
        )  # fmt: skip
        running.save()
        starter.wait(etcd, "/health", lambda: b'"health":"true"' in _get(etcd_url + "/health")[1])
        apiserver = starter.spawn(
            "kube-apiserver",
            [
                "--etcd-servers", etcd_url,
                "--bind-address", "127.0.0.1",
                "--advertise-address", "127.0.0.1",
                "--secure-port", str(api_port),
                "--cert-dir", str(state_dir / "pki"),
                "--tls-cert-file", str(keys.apiserver.cert),
                "--tls-private-key-file", str(keys.apiserver.key),
                "--client-ca-file", str(keys.ca.cert),
                "--service-account-key-file", str(keys.service_account_pub),
                "--service-account-signing-key-file", str(keys.service_account_key),
                "--service-account-issuer", "https://kubernetes.default.svc",
                "--service-cluster-ip-range", SERVICE_CIDR,
                "--authorization-mode", "Node,RBAC",
                "--allow-privileged=true",  # as real clusters run: ARC's docker-in-docker sidecar is privileged
                # The default reconciler refuses a loopback advertise address.
                "--endpoint-reconciler-type", "none",
            ],
        )  # fmt: skip
        running.save()
        ctx = _tls_context(keys)
        starter.wait(apiserver, "/readyz", lambda: _get(server + "/readyz", ctx)[0] == 200)
        kcm = starter.spawn(
            "kube-controller-manager",
            [
                "--kubeconfig", str(kcm_kubeconfig),
                "--authentication-kubeconfig", str(kcm_kubeconfig),
                "--authorization-kubeconfig", str(kcm_kubeconfig),
                "--controllers", "*",
                "--use-service-account-credentials",
                "--service-account-private-key-file", str(keys.service_account_key),
                "--root-ca-file", str(keys.ca.cert),
                "--cluster-signing-cert-file", str(keys.ca.cert),
                "--cluster-signing-key-file", str(keys.ca.key),
                "--bind-address", "127.0.0.1",
                "--secure-port", "0",
                "--leader-elect=false",
            ],
        )  # fmt: skip
        running.save()
        # The service-account controller creating `default` in `default` shows the controllers run.
        starter.wait(
            kcm,
            "the default ServiceAccount",
            lambda: _get(server + "/api/v1/namespaces/default/serviceaccounts/default", ctx)[0] == 200,
        )
    except BaseException:
        stop(running, remove=False)
        raise
    return running


def alive(comp: Component) -> bool:
    """True when ``comp.pid`` still runs ``comp.exe`` (not a recycled pid)."""
    try:
        return os.readlink(f"/proc/{comp.pid}/exe").removesuffix(" (deleted)") == comp.exe
    except OSError:
        return False


def stop(running: Running, *, remove: bool = True, keep_logs: bool = False) -> None:
    """Stop the components (newest first: SIGTERM, then SIGKILL after a grace period) and, with
    ``remove``, delete the state directory (all but ``logs/`` with ``keep_logs``)."""
    for proc in reversed(running.processes):
        # Started by this process: wait() reaps it and marks the Popen finished.
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    for comp in reversed(running.components):
        if not alive(comp):
            continue
        os.kill(comp.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while alive(comp) and time.monotonic() < deadline:
            _reap(comp.pid)
            time.sleep(0.05)  # bounded wait for the process to exit
        if alive(comp):
            os.kill(comp.pid, signal.SIGKILL)
        _reap(comp.pid)
    if remove and keep_logs:
        for entry in Path(running.state_dir).iterdir():
            if entry.is_dir() and entry.name != "logs":
                _remove_tree(entry)
            elif not entry.is_dir():
                entry.unlink()
    elif remove:
        _remove_tree(Path(running.state_dir))


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def is_ready(running: Running) -> bool:
    keys_dir = Path(running.state_dir) / "pki"
    ctx = ssl.create_default_context(cafile=str(keys_dir / "ca.crt"))
    ctx.load_cert_chain(str(keys_dir / "admin.crt"), str(keys_dir / "admin.key"))
    return _get(running.server + "/readyz", ctx)[0] == 200
