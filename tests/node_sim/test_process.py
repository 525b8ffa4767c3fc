"""Process pods: the first container runs as a real local subprocess with its secret volumes
materialised and container paths rewritten; deletion stops it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from services.embedded.node_sim.kube import KubeRest
from tests.fixtures.apiserver import KubeApi

from .helpers import (
    Lines,
    conditions,
    create,
    create_secret,
    cstatus,
    node_config,
    phase,
    pod_body,
    running_node,
    wait_gone,
    wait_pod,
    wait_until,
)

pytestmark = pytest.mark.anyio

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]

PRINT_CONFIG = """
import os, sys
print("argv", sys.argv[1])
print("config", open(sys.argv[1]).read())
print("env", os.environ["POD_NAME"], os.environ["POD_NAMESPACE"], os.environ["CONFIG_PATH"], os.environ["GREETING"])
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


async def test_process_pod_runs_with_materialised_secret_volume(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path
) -> None:
    config = {"configure_url": "http://127.0.0.1/octo-org", "min_runners": 1}
    await create_secret(kube, namespace, "listener-config", {"config.json": json.dumps(config)})
    await kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        body={"metadata": {"name": "greet"}, "data": {"greeting": "hello"}},
    )
    container = {
        "name": "listener",
        "image": "python:3.11",
        "command": [sys.executable, "-c", PRINT_CONFIG],
        "args": ["/etc/gha-listener/config.json"],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "CONFIG_PATH", "value": "/etc/gha-listener/config.json"},
            {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "greet", "key": "greeting"}}},
        ],
        "volumeMounts": [{"name": "listener-config", "mountPath": "/etc/gha-listener", "readOnly": True}],
    }
    body = pod_body(
        "listener",
        containers=[container],
        restart_policy="Never",
        annotations={"runnerscale.dev/node-sim-exec": "true"},
        volumes=[{"name": "listener-config", "secret": {"secretName": "listener-config"}}],
    )
    out = Lines()
    async with running_node(node_config(kube_api, namespace, tmp_path), output=out) as node:
        await create(kube, namespace, "pods", body)
        pod = await wait_pod(
            kube, namespace, "listener", lambda p: phase(p) in ("Succeeded", "Failed"), what="finished"
        )
        assert phase(pod) == "Succeeded", out.lines
        assert cstatus(pod)["state"]["terminated"]["exitCode"] == 0
        assert pod["status"]["podIP"] == "127.0.0.1"  # a real local process: the host's address

        state_dir = str(tmp_path / "node-state")
        argv_line = next(line for line in out.lines if line.startswith("[listener] argv "))
        materialised = argv_line.split(" ", 2)[2]
        assert materialised.startswith(state_dir) and materialised.endswith("/volumes/listener-config/config.json")
        assert f"[listener] config {json.dumps(config)}" in out.lines
        assert f"[listener] env listener {namespace} {materialised} hello" in out.lines
        assert any(line.startswith("argv ") for line in node.logs(namespace, "listener"))


async def test_deleting_a_process_pod_stops_the_process(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path
) -> None:
    # Selected by image (no annotation); ignores SIGTERM, so the node sim must SIGKILL it after the
    # pod's 1 s grace period.
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"
    )
    container = {"name": "main", "image": "ghcr.io/example/runnerscale:dev", "command": [sys.executable, "-c", script]}
    out = Lines()
    async with running_node(node_config(kube_api, namespace, tmp_path), output=out) as node:
        await create(
            kube, namespace, "pods", pod_body("sleeper", containers=[container], terminationGracePeriodSeconds=1)
        )
        await wait_pod(kube, namespace, "sleeper", lambda p: phase(p) == "Running", what="Running")
        await wait_until(lambda: "[sleeper] up" in out.lines, what="process output")
        worker = node.find(namespace, "sleeper")
        assert worker is not None
        pid = worker.pids()["main"]
        assert _alive(pid)

        await kube.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/sleeper")
        await wait_gone(kube, namespace, "sleeper", timeout=10)
        await wait_until(lambda: not _alive(pid), timeout=5, what="process gone")


async def test_crashing_process_restarts_with_backoff(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path
) -> None:
    container = {
        "name": "crasher",
        "image": "runnerscale:dev",
        "command": [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    async with running_node(node_config(kube_api, namespace, tmp_path)):
        await create(kube, namespace, "pods", pod_body("crasher", containers=[container], restart_policy="Always"))
        pod = await wait_pod(
            kube, namespace, "crasher", lambda p: cstatus(p).get("restartCount", 0) >= 2, what="two restarts"
        )
        cs = cstatus(pod)
        assert phase(pod) == "Running"
        last = cs["lastState"]["terminated"]
        assert last["exitCode"] == 3 and last["reason"] == "Error" and last["message"] == "boom"


async def test_unrunnable_command_is_a_start_error(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path
) -> None:
    no_command = {"name": "c", "image": "runnerscale:dev"}
    missing = {
        "name": "c",
        "image": "runnerscale:dev",
        "command": ["/no/such/binary"],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    async with running_node(node_config(kube_api, namespace, tmp_path)):
        await create(kube, namespace, "pods", pod_body("no-cmd", containers=[no_command], restart_policy="Never"))
        await create(kube, namespace, "pods", pod_body("missing", containers=[missing], restart_policy="Never"))
        pod = await wait_pod(kube, namespace, "no-cmd", lambda p: phase(p) == "Failed", what="Failed")
        term = cstatus(pod)["state"]["terminated"]
        assert term["exitCode"] == 128 and term["reason"] == "StartError" and "command" in term["message"]
        pod = await wait_pod(kube, namespace, "missing", lambda p: phase(p) == "Failed", what="Failed")
        term = cstatus(pod)["state"]["terminated"]
        assert term["exitCode"] == 128 and "/no/such/binary" in term["message"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_probes_drive_readiness_and_liveness_restarts(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path
) -> None:
    port = _free_port()
    server = {
        "name": "web",
        "image": "runnerscale:dev",
        "command": [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        "ports": [{"name": "http", "containerPort": port}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "initialDelaySeconds": 1, "periodSeconds": 1},
    }
    dead_port = _free_port()  # nothing listens there: liveness fails
    doomed = {
        "name": "doomed",
        "image": "runnerscale:dev",
        "command": SLEEPER,
        "livenessProbe": {"tcpSocket": {"port": dead_port}, "periodSeconds": 1, "failureThreshold": 2},
    }
    async with running_node(node_config(kube_api, namespace, tmp_path)):
        await create(kube, namespace, "pods", pod_body("web", containers=[server]))
        await create(kube, namespace, "pods", pod_body("doomed", containers=[doomed], terminationGracePeriodSeconds=1))

        pod = await wait_pod(kube, namespace, "web", lambda p: "running" in cstatus(p).get("state", {}), what="running")
        assert cstatus(pod)["ready"] is False  # not before the readiness probe passed
        pod = await wait_pod(kube, namespace, "web", lambda p: cstatus(p).get("ready") is True, what="ready")
        assert conditions(pod)["Ready"]["status"] == "True"

        pod = await wait_pod(
            kube, namespace, "doomed", lambda p: cstatus(p).get("restartCount", 0) >= 1, what="restarted by liveness"
        )
        assert cstatus(pod)["lastState"]["terminated"]["exitCode"] == 143  # SIGTERM
        events = await kube.request("GET", f"/api/v1/namespaces/{namespace}/events")
        messages = [e["message"] for e in events["items"] if e["involvedObject"]["name"] == "doomed"]
        assert any(m.startswith("Liveness probe failed: dial tcp") for m in messages)
        assert "Container doomed failed liveness probe, will be restarted" in messages
