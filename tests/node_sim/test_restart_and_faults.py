"""A restarted node sim adopts its pods kubelet-style; fault knobs over the control endpoint."""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp
import anyio
import pytest

from services.embedded.node_sim.control import serve_control
from services.embedded.node_sim.kube import KubeRest
from tests.fixtures.apiserver import KubeApi

from .helpers import conditions, create, cstatus, node_config, phase, pod_body, running_node, wait_pod, wait_until
from .test_process import _alive

pytestmark = pytest.mark.anyio

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


async def test_restart_treats_running_containers_as_lost(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path
) -> None:
    cfg = node_config(kube_api, namespace, tmp_path)
    async with running_node(cfg) as node:
        await create(kube, namespace, "pods", pod_body("always", containers=[{"name": "c", "image": "busybox"}]))
        await create(
            kube,
            namespace,
            "pods",
            pod_body(
                "never",
                containers=[{"name": "p", "image": "runnerscale:dev", "command": SLEEP}],
                restart_policy="Never",
            ),
        )
        # `runnerscale ...` runs this checkout's CLI with this interpreter.
        await create(
            kube,
            namespace,
            "pods",
            pod_body(
                "done",
                containers=[{"name": "p", "image": "runnerscale:dev", "command": ["runnerscale", "version"]}],
                restart_policy="Never",
            ),
        )
        for name in ("always", "never"):
            await wait_pod(kube, namespace, name, lambda p: phase(p) == "Running", what="Running")
        done = await wait_pod(kube, namespace, "done", lambda p: phase(p) == "Succeeded", what="Succeeded")

        def never_pid() -> int | None:
            worker = node.find(namespace, "never")
            return worker.pids().get("p") if worker is not None else None

        pid = await wait_until(never_pid, what="pid")
    # The node sim is gone and took its processes with it.
    await wait_until(lambda: not _alive(pid), timeout=5, what="process stopped with the node sim")
    # A pod created while no node runs waits for one.
    await create(kube, namespace, "pods", pod_body("later", containers=[{"name": "c", "image": "busybox"}]))

    async with running_node(cfg):
        pod = await wait_pod(
            kube,
            namespace,
            "always",
            lambda p: cstatus(p).get("restartCount") == 1 and "running" in cstatus(p)["state"],
            what="restarted",
        )
        last = cstatus(pod)["lastState"]["terminated"]
        assert (last["exitCode"], last["reason"]) == (137, "ContainerStatusUnknown")
        assert phase(pod) == "Running"

        pod = await wait_pod(kube, namespace, "never", lambda p: phase(p) == "Failed", what="Failed")
        term = cstatus(pod)["state"]["terminated"]
        assert (term["exitCode"], term["reason"]) == (137, "ContainerStatusUnknown")
        assert conditions(pod)["Ready"]["status"] == "False"

        await wait_pod(kube, namespace, "later", lambda p: phase(p) == "Running", what="Running")
        # A finished pod is left exactly as it was.
        again = await kube.get("pods", namespace, "done")
        assert again is not None and again["metadata"]["resourceVersion"] == done["metadata"]["resourceVersion"]


async def test_fault_knobs_over_the_control_endpoint(
    kube_api: KubeApi, namespace: str, kube: KubeRest, tmp_path: Path
) -> None:
    cfg = node_config(kube_api, namespace, tmp_path, fail_image_pulls=["registry.example/broken*"])
    async with running_node(cfg) as node, anyio.create_task_group() as tg, aiohttp.ClientSession() as http:
        port = await tg.start(serve_control, node, "127.0.0.1", 0)
        base = f"http://127.0.0.1:{port}"

        # Image pull failure: ErrImagePull / ImagePullBackOff until the fault is cleared.
        await create(
            kube, namespace, "pods", pod_body("pull", containers=[{"name": "c", "image": "registry.example/broken:1"}])
        )
        pod = await wait_pod(
            kube,
            namespace,
            "pull",
            lambda p: (
                cstatus(p).get("state", {}).get("waiting", {}).get("reason") in ("ErrImagePull", "ImagePullBackOff")
            ),
            what="pull failure",
        )
        assert phase(pod) == "Pending"
        async with http.get(f"{base}/faults") as resp:
            assert (await resp.json())["image_pull"] == ["registry.example/broken*"]
        async with http.delete(f"{base}/faults/image-pull") as resp:
            assert resp.status == 200
        await wait_pod(
            kube, namespace, "pull", lambda p: phase(p) == "Running", what="Running after the fault is cleared"
        )

        # Crash: the container is killed and restarted per restartPolicy Always.
        async with http.post(f"{base}/pods/{namespace}/pull/crash", json={"exit_code": 2}) as resp:
            assert resp.status == 200
        pod = await wait_pod(
            kube,
            namespace,
            "pull",
            lambda p: cstatus(p).get("restartCount") == 1 and "running" in cstatus(p)["state"],
            what="restarted",
        )
        assert cstatus(pod)["lastState"]["terminated"]["exitCode"] == 2
        async with http.post(f"{base}/pods/{namespace}/nope/crash", json={}) as resp:
            assert resp.status == 404
        async with http.post(f"{base}/faults/image-pull", json={"patern": "x"}) as resp:
            assert resp.status == 400 and "patern" in await resp.text()

        # Lose the node: pods on it end Failed / NodeLost; new pods are still scheduled afterwards.
        async with http.post(f"{base}/node/lose") as resp:
            assert (await resp.json())["pods"] == 1
        pod = await wait_pod(kube, namespace, "pull", lambda p: phase(p) == "Failed", what="Failed")
        assert pod["status"]["reason"] == "NodeLost"
        assert cstatus(pod)["state"]["terminated"]["reason"] == "ContainerStatusUnknown"
        await create(kube, namespace, "pods", pod_body("after", containers=[{"name": "c", "image": "busybox"}]))
        await wait_pod(kube, namespace, "after", lambda p: phase(p) == "Running", what="Running")
        tg.cancel_scope.cancel()
